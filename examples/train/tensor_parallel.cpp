// --tensor-parallel T (MPI, --model vit): every transformer block's attention (by heads) and
// MLP split over T ranks, Megatron-style, or as a kat_plan plan says (--plan); the ranks form
// (ranks / T) data-parallel replicas (docs/tensor_parallel.md).
#include "run.hpp"

#include <kat/distributed/tensor_parallel/tensor_parallel_model.hpp>
#include <kat/nn/models.hpp>
#include <kat/plan/plan_io.hpp>

#include <cstdio>

namespace kat_train {
namespace {

// The bytes this rank's tensor-parallel layers hand to MPI in the training steps (evaluation
// excluded), per step of a full local batch (the bytes are proportional to the rows, so a
// shorter last batch does not skew it), and what the plan predicted (--plan).
class TensorParallelReport : public kat::train::Callback<Scalar, Mem> {
public:
  TensorParallelReport(const kat::distributed::Communicator &comm, double predicted,
                       std::size_t local_batch)
      : comm_(comm), predicted_(predicted), batch_(static_cast<double>(local_batch)) {}
  std::string name() const override { return "tensor_parallel"; }
  void on_epoch_begin(Trainer &) override { bytes_ = seen_ = 0; }
  void on_step_begin(Trainer &) override { start_ = total(); }
  void on_step_end(Trainer &trainer) override {
    bytes_ += total() - start_;
    seen_ = static_cast<double>(trainer.position().seen); // this epoch's samples so far
  }
  void on_epoch_end(Trainer &, kat::train::EpochSummary &summary) override {
    const double per_step = seen_ > 0 ? bytes_ / seen_ * batch_ : 0;
    summary.metrics.push_back({"tp_bytes_per_step", per_step, 0});
    char note[96];
    if (predicted_ > 0) {
      std::snprintf(note, sizeof note, "  tensor-parallel %.3f MB/step (plan: %.3f)",
                    per_step / 1e6, predicted_ / 1e6);
    } else {
      std::snprintf(note, sizeof note, "  tensor-parallel %.3f MB/step", per_step / 1e6);
    }
    summary.note += note;
  }

private:
  double total() const {
    const auto s = comm_.stats();
    return static_cast<double>(s.allreduce.bytes + s.iallreduce.bytes);
  }
  const kat::distributed::Communicator &comm_;
  double predicted_, batch_;
  double bytes_ = 0, start_ = 0, seen_ = 0;
};

class TensorParallel : public Component {
public:
  void add_flags(Run &r) override {
    add_integer(r.app, "--tensor-parallel", r.tensor_parallel, 1, 1 << 16,
                "vit: split every transformer block's attention (by heads) and MLP over T ranks, "
                "Megatron-style; the ranks form (ranks / T) data-parallel replicas "
                "(docs/tensor_parallel.md)");
    r.app
        .add_option("--plan", plan_file_,
                    "with --tensor-parallel: a plan from kat_plan --vit (JSON) choosing which "
                    "blocks' attention and MLP to split")
        ->check(CLI::ExistingFile);
  }

  void check(Run &r) override {
    const int T = r.tensor_parallel;
    if (!plan_file_.empty() && T == 1) {
      throw CLI::ValidationError("--plan", "needs --tensor-parallel T > 1");
    }
    if (T == 1) {
      return;
    }
    if (r.model_name != "vit") {
      throw CLI::ValidationError("--tensor-parallel", "needs --model vit");
    }
    if (r.world->size() % T != 0) {
      throw CLI::ValidationError("--tensor-parallel",
                                 "must divide the " + std::to_string(r.world->size()) + " ranks");
    }
    if (r.vit.heads % static_cast<std::size_t>(T) != 0) {
      throw CLI::ValidationError("--tensor-parallel",
                                 "must divide --vit-heads (" + std::to_string(r.vit.heads) + ")");
    }
    for (const char *other : {"dist-strategy", "agent", "sparsity"}) {
      const Flag *f = r.find_flag(other);
      if (f != nullptr && f->given()) {
        throw CLI::ValidationError("--tensor-parallel",
                                   std::string("cannot be combined with --") + other);
      }
    }
    if (r.optimizer_name == "kfac" || r.optimizer_name.rfind("fosi", 0) == 0) {
      throw CLI::ValidationError("--tensor-parallel",
                                 "runs with element-wise optimizers (sgd, adam, adamw); " +
                                     r.optimizer_name +
                                     "'s global quantities would differ between the shards");
    }
    if (!r.checkpoint_dir.empty()) {
      throw CLI::ValidationError("--tensor-parallel",
                                 "cannot checkpoint yet (each rank holds a shard)");
    }
  }

  // A (ranks / T) x T mesh; the data-parallel group trains together.
  void setup_processes(Run &r) override {
    if (r.tensor_parallel > 1) {
      mesh_.emplace(*r.comm, r.tensor_parallel);
      mesh_->tensor().set_checked(false); // two all-reduces per block: no agreement round trips
      r.train_comm = &mesh_->data();
    }
  }

  // The blocks' splits: all (Megatron's plan) or as --plan says, cut from the single-rank
  // model every rank's shards come from.
  void prepare(Run &r) override {
    if (!mesh_) {
      return;
    }
    const auto &data = *r.train_set;
    whole_.emplace(kat::nn::models::vit<Scalar, Mem>(data.shape, data.classes, r.vit));
    if (!plan_file_.empty()) {
      const auto plan = kat::plan::read_plan(plan_file_);
      splits_ = kat::distributed::tensor_parallel_splits(plan, *whole_, mesh_->tensor_size());
      if (plan.mesh.data != mesh_->data_size()) {
        throw kat::ValueError(
            kat::detail::concat("kat_train: --plan ", plan_file_, " is for ", plan.mesh.data,
                                " data-parallel replicas, the run has ", mesh_->data_size()));
      }
      for (const auto &c : plan.collectives) {
        if (c.group == kat::plan::Group::tensor) {
          predicted_bytes_ += c.bytes;
        }
      }
    }
    r.make_model = [this, &r] {
      const auto &d = *r.train_set;
      return kat::distributed::vit_tensor_parallel<Scalar, Mem>(d.shape, d.classes, r.vit,
                                                                mesh_->tensor(), splits_);
    };
  }

  void model_ready(Run &r, const Space &space) override {
    if (whole_) { // every shard cut from the same single-rank model
      whole_->compile(space, r.seed);
      kat::distributed::copy_sharded_parameters(space, *whole_, *r.model);
      whole_.reset(); // its parameters are in the shards now
    }
  }

  void attach(Run &r, const Space &) override {
    if (mesh_) {
      r.trainer->add_callback(
          std::make_shared<TensorParallelReport>(mesh_->tensor(), predicted_bytes_, r.local_batch));
      r.columns.push_back("tp_bytes_per_step");
    }
  }

  void describe(Run &r) override {
    if (!mesh_) {
      return;
    }
    std::size_t attention = 0, mlp = 0;
    for (const auto &sp : splits_.empty()
                              ? std::vector<kat::distributed::TensorParallelSplit>(r.vit.depth)
                              : splits_) {
      attention += sp.attention;
      mlp += sp.mlp;
    }
    std::printf("tensor parallel: %d ranks per replica, %d replicas; of %zu blocks, %zu split "
                "their attention by heads and %zu their MLP (%s)\n",
                mesh_->tensor_size(), mesh_->data_size(), r.vit.depth, attention, mlp,
                plan_file_.empty() ? "Megatron-LM's plan" : plan_file_.c_str());
  }

private:
  std::string plan_file_;
  std::optional<kat::distributed::TensorParallelMesh> mesh_;
  std::optional<Model> whole_;
  std::vector<kat::distributed::TensorParallelSplit> splits_;
  double predicted_bytes_ = 0;
};
const auto tensor_parallel = register_component<TensorParallel>(50);

} // namespace
} // namespace kat_train
