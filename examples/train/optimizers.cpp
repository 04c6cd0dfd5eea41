// The optimizer and its learning-rate schedule: --optimizer picks a registered optimizer
// (SGD, Adam and AdamW here; K-FAC and FOSI register from their own files), --schedule a
// registered schedule; their options are flags, refused when they are not the chosen ones'.
#include "optimizers.hpp"

#include <kat/optim/adam.hpp>
#include <kat/optim/lr_schedule.hpp>
#include <kat/optim/sgd.hpp>
#include <kat/train/lr_schedules.hpp>

#include <algorithm>
#include <utility>

namespace kat_train {
namespace {

// The base rate: --lr, or the optimizer's default.
double base_lr(const Config &c, double fallback) { return c.has("lr") ? c.number("lr") : fallback; }

template <class AdamT> void make_adam_type(Setup &s, double default_decay) {
  typename AdamT::Options o;
  o.lr = base_lr(s.config, 1e-3);
  o.weight_decay = s.config.has("weight-decay") ? s.config.number("weight-decay") : default_decay;
  s.optimizer = std::make_unique<AdamT>(s.parameters, o);
  s.lr = s.schedule_from(o.lr);
}

#ifdef KAT_ENABLE_MPI
// Data parallelism (the default on several ranks) or DASO; K-FAC and FOSI add their own.
const Opt daso_strategy{"dist-strategy",
                        "Distributed strategy on several ranks: daso (docs/distributed.md) "
                        "instead of synchronous data parallelism",
                        "",
                        {"daso"}};
#endif

std::vector<Opt> with_daso(std::vector<Opt> options) {
#ifdef KAT_ENABLE_MPI
  options.push_back(daso_strategy);
#endif
  return options;
}

const OptimizerRegistration sgd(10, "sgd", "SGD with momentum (PyTorch's torch.optim.SGD)",
                                with_daso(sgd_options()), [](Setup &s) { make_sgd(s); });
const OptimizerRegistration adam(20, "adam", "Adam (Kingma & Ba 2015)", with_daso(adam_options()),
                                 [](Setup &s) { make_adam(s); });
const OptimizerRegistration adamw(30, "adamw", "AdamW (Loshchilov & Hutter 2019)",
                                  with_daso(adam_options()), [](Setup &s) {
                                    make_adam_type<kat::optim::AdamW<Scalar, Mem>>(s, 0.01);
                                  });

class Optimizer : public Component {
public:
  void add_flags(Run &r) override {
    r.app.add_option("--optimizer", r.optimizer_name, "One of the registered optimizers below")
        ->check(CLI::IsMember(optimizers().names()))
        ->capture_default_str();
    r.app.add_option("--schedule", schedule_name_, "Learning-rate schedule per step")
        ->check(CLI::IsMember(schedules_.names()))
        ->capture_default_str();
    add_integer(r.app, "--warmup-steps", warmup_steps_, 0, 1 << 30,
                "Linear warm-up steps before the schedule");
    add_registry(r, optimizers());
    add_registry(r, schedules_);
  }

  // An optimizer's or schedule's option given on the command line must be the chosen ones'.
  void check(Run &r) override {
    const auto declares = [](const auto &entry, const std::string &name) {
      return std::any_of(entry.options.begin(), entry.options.end(),
                         [&](const Opt &o) { return o.name == name; });
    };
    for (const auto &f : r.flags) {
      if (!f.given() || (f.owner != optimizers().what() && f.owner != schedules_.what())) {
        continue;
      }
      if (!declares(optimizers().at(r.optimizer_name), f.name) &&
          !declares(schedules_.at(schedule_name_), f.name)) {
        throw CLI::ValidationError("--" + f.name, "is not an option of --optimizer " +
                                                      r.optimizer_name + " or --schedule " +
                                                      schedule_name_);
      }
    }
  }

  void make_optimizer(Run &r) override {
    const auto steps = static_cast<std::int64_t>(r.sampler->batches(r.local_batch)) * r.epochs;
    r.setup.emplace(Setup{r.config, *r.model,
                          [this, &r, steps](double lr) {
                            auto s = schedules_.at(schedule_name_).make(r.config, lr, steps);
                            return warmup_steps_ > 0 ? kat::optim::linear_warmup(warmup_steps_, s)
                                                     : s;
                          },
                          *r.group,
#ifdef KAT_ENABLE_MPI
                          nullptr, nullptr, nullptr,
#endif
                          *r.train_set, r.local_batch, r.seed, r.profile});
#ifdef KAT_ENABLE_MPI
    // K-FAC's strategies communicate on their own communicator (their own counters).
    kfac_comm_.emplace(r.train_comm->dup());
    node_comm_.emplace(r.train_comm->split_shared()); // K-FAC's with DASO
    r.setup->comm = &*kfac_comm_;
    r.setup->node_comm = &*node_comm_;
    r.setup->dho2_roles = r.dho2_roles ? &*r.dho2_roles : nullptr;
    r.communicators.push_back(&*kfac_comm_);
    r.communicators.push_back(&*node_comm_);
#endif
    optimizers().at(r.optimizer_name).make(*r.setup);
  }

  void attach(Run &r, const Space &) override {
    for (const auto &t : r.setup->transforms) {
      r.trainer->add_transform(t);
    }
    for (const auto &c : r.setup->callbacks) {
      r.trainer->add_callback(c); // before the logger and writer, which print their notes
    }
    r.columns.insert(r.columns.end(), r.setup->columns.begin(), r.setup->columns.end());
  }

private:
  kat::train::Registry<kat::train::LRScheduleFactory> schedules_ = kat::train::lr_schedules();
  std::string schedule_name_ = "constant";
  int warmup_steps_ = 0;
#ifdef KAT_ENABLE_MPI
  std::optional<kat::distributed::Communicator> kfac_comm_, node_comm_;
#endif
};
const auto optimizer = register_component<Optimizer>(20);

} // namespace

std::vector<Opt> adam_options() {
  using Range = kat::train::OptionRange;
  return {Opt{"lr", "Learning rate [default: 0.05 for sgd and kfac, 0.001 for adam/adamw]"}.within(
              Range::at_least(0)),
          Opt{"weight-decay",
              "L2 penalty (sgd, adam) or decoupled decay (adamw) [default: 0, adamw 0.01]"}
              .within(Range::at_least(0))};
}

std::vector<Opt> sgd_options() {
  const auto lr_wd = adam_options();
  return {lr_wd[0],
          Opt{"momentum", "SGD momentum", "0.9"}.within(kat::train::OptionRange::half_open(0, 1)),
          {"nesterov", "Nesterov momentum (sgd)", "", {}, true},
          lr_wd[1]};
}

void make_sgd(Setup &s, bool nesterov) {
  kat::optim::SGD<Scalar, Mem>::Options o;
  o.lr = base_lr(s.config, 0.05);
  o.momentum = s.config.number("momentum");
  o.nesterov = nesterov || s.config.flag("nesterov");
  o.weight_decay = s.config.has("weight-decay") ? s.config.number("weight-decay") : 0.0;
  s.optimizer = std::make_unique<kat::optim::SGD<Scalar, Mem>>(s.parameters, o);
  s.lr = s.schedule_from(o.lr);
}

void make_adam(Setup &s) { make_adam_type<kat::optim::Adam<Scalar, Mem>>(s, 0.0); }

} // namespace kat_train
