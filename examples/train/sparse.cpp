// Sparse training with any optimizer: masks, SET and RigL (--sparsity and its options,
// docs/sparse.md).
#include "run.hpp"

#include <kat/sparse/options.hpp>
#include <kat/sparse/sparse_training.hpp>

#include <cstdio>
#include <cstdlib>
#include <string>

namespace kat_train {
namespace {

class SparseTraining : public Component {
public:
  void add_flags(Run &r) override {
    r.add_options("sparse", "sparse", "Sparse training: masks, SET, RigL (docs/sparse.md)",
                  with_ranges(kat::sparse::sparse_option_specs()));
  }

  // The specs with the ranges SparseTraining accepts, so a value outside them is a usage
  // error at parsing (--sparsity -0.1 would otherwise train dense without a word).
  static std::vector<Opt> with_ranges(std::vector<Opt> specs) {
    using Range = kat::train::OptionRange;
    for (auto &o : specs) {
      if (o.name == "sparsity") {
        o.range = Range::half_open(0, 1);
      } else if (o.name == "drop-fraction" || o.name == "t-end") {
        o.range = Range::closed(0, 1);
      } else if (o.name == "delta-t") {
        o.range = Range::integer_at_least(1);
      }
    }
    return specs;
  }

  // Its options need --sparsity > 0, and those of the mask updates a method that updates the
  // mask: with static masks they would be accepted and do nothing.
  void check(Run &r) override {
    const bool sparse = std::strtod(r.flag("sparsity").value.c_str(), nullptr) > 0.0;
    const std::string &method = r.flag("sparse-method").value;
    for (const auto &f : r.flags) {
      if (!f.given() || f.owner != "sparse" || f.name == "sparsity") {
        continue;
      }
      if (!sparse) {
        throw CLI::ValidationError("--" + f.name, "needs --sparsity > 0");
      }
      if (method == "static" && is_update_option(f.name)) {
        throw CLI::ValidationError("--" + f.name, "applies to the mask updates of --sparse-method "
                                                  "set or rigl, not static");
      }
    }
  }

  static bool is_update_option(const std::string &name) {
    return name == "drop-fraction" || name == "delta-t" || name == "t-end";
  }

  void attach(Run &r, const Space &space) override {
    if (r.config.number("sparsity") > 0) {
      sparse_ = std::make_shared<kat::sparse::SparseTraining<Scalar, Mem>>(
          *r.model, kat::sparse::sparse_training_options(r.config, r.seed));
      sparse_->set_profile(r.profile);
      sparse_->attach(space, *r.model); // Dense layers below the crossover density run sparse
      r.trainer->add_callback(sparse_); // before the logger and writer, which print its note
      r.columns.insert(r.columns.end(), {"density", "mask_update_s"});
    }
    r.identity.emplace_back("sparsity", r.config.text("sparsity"));
  }

  void describe(Run &) override {
    if (sparse_) {
      std::printf("%s\n", sparse_->summary().c_str());
    }
  }

private:
  std::shared_ptr<kat::sparse::SparseTraining<Scalar, Mem>> sparse_;
};
const auto sparse_training = register_component<SparseTraining>(15);

} // namespace
} // namespace kat_train
