// Adaptive gradient correction with any optimizer (--agent and its options, AGENT: "Balance is
// Essence", docs/sparse.md): a gradient transform before any preconditioner, and the probe
// network that refreshes its reference.
#include "run.hpp"

#include <kat/sparse/agent.hpp>
#include <kat/sparse/agent_probe.hpp>
#include <kat/sparse/options.hpp>

#include <cstdio>

namespace kat_train {
namespace {

class AdaptiveGradientCorrection : public Component {
public:
  void add_flags(Run &r) override {
    r.add_options("agent", "agent", "Adaptive gradient correction, with any optimizer",
                  kat::sparse::agent_option_specs());
  }

  // Its options need --agent.
  void check(Run &r) override {
    const bool agent = r.flag("agent").given();
    for (const auto &f : r.flags) {
      if (f.given() && f.owner == "agent" && f.name != "agent" && !agent) {
        throw CLI::ValidationError("--" + f.name, "needs --agent");
      }
    }
  }

  // After sparse training's (order 15): its mask is applied when the probe starts; before the
  // optimizers' (20): AGENT corrects the gradient before a preconditioner sees it.
  void attach(Run &r, const Space &space) override {
    // The probe is a second network of the same architecture; its refresh pass reads this
    // rank's shard.
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
    if (agent_probe) {
      r.trainer->add_callback(agent_probe); // after the mask's on_train_begin: θ̃ is masked
      r.columns.insert(r.columns.end(), {"agent_tau", "agent_refresh_s"});
    }
    r.identity.emplace_back("agent", r.config.flag("agent") ? "on" : "off");
  }

  void describe(Run &) override {
    if (agent_) {
      std::printf("%s\n", agent_->summary().c_str());
    }
  }

private:
  std::shared_ptr<kat::sparse::AGENT<Scalar, Mem>> agent_;
  std::unique_ptr<Model> probe_;
  std::unique_ptr<kat::data::DataLoader<Scalar, Mem>> refresh_loader_;
};
const auto adaptive_gradient_correction = register_component<AdaptiveGradientCorrection>(16);

} // namespace
} // namespace kat_train
