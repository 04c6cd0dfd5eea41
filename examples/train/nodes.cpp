// Nodes on one machine (MPI): --ranks-per-node G treats blocks of G consecutive ranks as nodes,
// optionally with an emulated link between them (--emulate-internode-*), so hierarchical
// strategies (DASO) run on one machine; each epoch then reports what crossed the nodes.
#include "run.hpp"

#include <cstdio>

namespace kat_train {
namespace {

// What this epoch sent between the nodes, from every communicator the training uses
// (CommunicatorStats::internode): the bytes summed over the training ranks (internode_bytes)
// and the emulated link time per rank (internode_s, their mean), as metrics and a note on the
// epoch line.
class InternodeReport : public kat::train::Callback<Scalar, Mem> {
public:
  explicit InternodeReport(const std::vector<const kat::distributed::Communicator *> &comms)
      : comms_(comms) {}
  std::string name() const override { return "internode"; }
  void on_epoch_begin(Trainer &) override { start_ = totals(); }
  void on_epoch_end(Trainer &trainer, kat::train::EpochSummary &summary) override {
    const auto now = totals();
    std::vector<double> v{now[0] - start_[0], now[1] - start_[1]};
    trainer.process_group().sum(v);
    const double seconds = v[1] / trainer.process_group().size();
    summary.metrics.push_back({"internode_bytes", v[0], 0});
    summary.metrics.push_back({"internode_s", seconds, 3});
    char note[64];
    std::snprintf(note, sizeof note, "  inter-node %.1f MB", v[0] / 1e6);
    summary.note += note;
  }

private:
  std::vector<double> totals() const {
    std::vector<double> t{0, 0};
    for (const auto *c : comms_) {
      t[0] += static_cast<double>(c->stats().internode.bytes);
      t[1] += c->stats().internode_seconds;
    }
    return t;
  }
  const std::vector<const kat::distributed::Communicator *> &comms_; // complete by the 1st epoch
  std::vector<double> start_{0, 0};
};

class Nodes : public Component {
public:
  void add_flags(Run &r) override {
    add_integer(r.app, "--ranks-per-node", ranks_per_node_, 0, 1 << 20,
                "Treat blocks of G consecutive ranks as nodes (0: ranks sharing memory), to run "
                "hierarchical strategies (DASO) on one machine");
    r.app
        .add_option("--emulate-internode-latency", latency_,
                    "Emulated inter-node link: seconds added to every operation between the "
                    "--ranks-per-node nodes (docs/distributed.md)")
        ->check(CLI::NonNegativeNumber);
    r.app
        .add_option("--emulate-internode-bandwidth", bandwidth_,
                    "Emulated inter-node link: bytes per second (0: unlimited)")
        ->check(CLI::NonNegativeNumber);
  }

  void check(Run &) override {
    if ((latency_ > 0 || bandwidth_ > 0) && ranks_per_node_ == 0) {
      throw CLI::ValidationError("--emulate-internode-latency/bandwidth",
                                 "needs --ranks-per-node G > 0 (the emulated nodes)");
    }
  }

  // Virtual nodes and their emulated link, for every communicator derived from here on (the
  // thread budget used the machine's real nodes).
  void setup_processes(Run &r) override {
    r.comm->set_ranks_per_virtual_node(ranks_per_node_);
    r.comm->set_internode_link({latency_, bandwidth_});
  }

  void attach(Run &r, const Space &) override {
    if (ranks_per_node_ > 0) {
      r.trainer->add_callback(std::make_shared<InternodeReport>(r.communicators));
      r.columns.insert(r.columns.end(), {"internode_bytes", "internode_s"});
    }
  }

private:
  int ranks_per_node_ = 0; // 0: the machine's nodes
  double latency_ = 0, bandwidth_ = 0;
};
const auto nodes = register_component<Nodes>(5);

} // namespace
} // namespace kat_train
