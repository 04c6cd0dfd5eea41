// Sparse training with any optimizer: masks, SET and RigL (--sparsity and its options,
// docs/sparse.md), and adaptive gradient correction (--agent, AGENT).
#include "run.hpp"

#include <kat/sparse/agent.hpp>
#include <kat/sparse/agent_probe.hpp>
#include <kat/sparse/options.hpp>
#include <kat/sparse/sparse_training.hpp>

#include <cstdlib>

namespace kat_train {
namespace {

class SparseTraining : public Component {
public:
  void add_flags(Run &r) override {
    r.add_options("sparse", "sparse", "Sparse training: masks, SET, RigL (docs/sparse.md)",
                  kat::sparse::sparse_option_specs());
    r.add_options("agent", "agent", "Adaptive gradient correction, with any optimizer",
                  kat::sparse::agent_option_specs());
  }

  // Their options need --sparsity > 0 or --agent.
  void check(Run &r) override {
    const bool sparse = std::strtod(r.flag("sparsity").value.c_str(), nullptr) > 0.0;
    const bool agent = r.flag("agent").given();
    for (const auto &f : r.flags) {
      if (f.given() && f.owner == "sparse" && f.name != "sparsity" && !sparse) {
        throw CLI::ValidationError("--" + f.name, "needs --sparsity > 0");
      }
      if (f.given() && f.owner == "agent" && f.name != "agent" && !agent) {
        throw CLI::ValidationError("--" + f.name, "needs --agent");
      }
    }
  }

  void attach(Run &r, const Space &space) override {
    // AGENT corrects the gradient before any preconditioner sees it; its probe is a second
    // network of the same architecture, and its refresh pass reads this rank's shard.
    std::shared_ptr<kat::sparse::AGENTProbe<Scalar, Mem>> agent_probe;
    if (r.config.flag("agent")) {
      agent_ = std::make_shared<kat::sparse::AGENT<Scalar, Mem>>(
          r.model->parameter_count(), kat::sparse::agent_options(r.config));
      probe_ = std::make_unique<Model>(r.new_model(space));
      refresh_loader_ = std::make_unique<kat::data::DataLoader<Scalar, Mem>>(
          *r.train_set, r.local_batch, false, 0);
      std::vector<std::size_t> shard;
      kat::sparse::AGENTProbe<Scalar, Mem>::Average average;
#ifdef KAT_ENABLE_MPI
      const auto &group = *r.group;
      if (group.size() > 1) {
        for (std::size_t i = static_cast<std::size_t>(group.rank()); i < r.train_set->size();
             i += static_cast<std::size_t>(group.size())) {
          shard.push_back(i);
        }
        // As DataParallel averages the step's gradient, on a communicator of its own.
        average =
            [agent_comm = std::make_shared<kat::distributed::Communicator>(r.train_comm->dup())](
                const Space &s, const kat::Vector<Scalar, Mem> &g) { agent_comm->average(s, g); };
      }
#endif
      agent_probe = std::make_shared<kat::sparse::AGENTProbe<Scalar, Mem>>(
          agent_, *probe_, *refresh_loader_, shard, average);
      r.trainer->add_transform(agent_);
    }
    if (r.config.number("sparsity") > 0) {
      sparse_ = std::make_shared<kat::sparse::SparseTraining<Scalar, Mem>>(
          *r.model, kat::sparse::sparse_training_options(r.config, r.seed));
      sparse_->set_profile(r.profile);
      sparse_->attach(space, *r.model); // Dense layers below the crossover density run sparse
      r.trainer->add_callback(sparse_); // before the logger and writer, which print its note
      r.columns.insert(r.columns.end(), {"density", "mask_update_s"});
    }
    if (agent_probe) {
      r.trainer->add_callback(agent_probe); // after the mask's on_train_begin: θ̃ is masked
      r.columns.insert(r.columns.end(), {"agent_tau", "agent_refresh_s"});
    }
    r.identity.emplace_back("sparsity", r.config.text("sparsity"));
    r.identity.emplace_back("agent", r.config.flag("agent") ? "on" : "off");
  }

  void describe(Run &) override {
    if (sparse_) {
      std::printf("%s\n", sparse_->summary().c_str());
    }
    if (agent_) {
      std::printf("%s\n", agent_->summary().c_str());
    }
  }

private:
  std::shared_ptr<kat::sparse::AGENT<Scalar, Mem>> agent_;
  std::unique_ptr<Model> probe_;
  std::unique_ptr<kat::data::DataLoader<Scalar, Mem>> refresh_loader_;
  std::shared_ptr<kat::sparse::SparseTraining<Scalar, Mem>> sparse_;
};
const auto component = register_component<SparseTraining>(15);

} // namespace
} // namespace kat_train
