// What a run leaves behind and shows: the console (--progress), per-epoch metrics (--metrics),
// the profile (--profile), checkpoints (--checkpoint-*) and resuming from one (--resume).
#include "run.hpp"

#include <kat/train/checkpointer.hpp>
#include <kat/train/console_logger.hpp>
#include <kat/train/metrics_writer.hpp>
#include <kat/train/profiler.hpp>

#include <cstdint>
#include <cstdio>
#include <unistd.h>

namespace kat_train {
namespace {

class Output : public Component {
public:
  void add_flags(Run &r) override {
    r.app.add_option("--metrics", metrics_, "Per-epoch metrics to FILE (.csv or .jsonl)");
    r.app.add_flag("--profile", r.profile,
                   "Per-epoch profile: K-FAC time split, communicated bytes, state "
                   "(docs/kfac.md)");
    r.app.add_option("--progress", progress_, "Live progress bar: auto | always | never")
        ->check(CLI::IsMember({"auto", "always", "never"}))
        ->capture_default_str();
    r.app.add_option("--checkpoint-dir", r.checkpoint_dir, "Save checkpoints in DIR, one per rank");
    add_integer(r.app, "--checkpoint-every", r.checkpoint_every, 0, std::int64_t(1) << 40,
                "Save every N steps and after the last epoch (0: every epoch)");
    r.app.add_option("--resume", resume_, "Continue from latest (in --checkpoint-dir) or FILE");
    add_integer(r.app, "--keep-checkpoints", keep_, 1, 1 << 20, "How many of the newest to keep");
  }

  void check(Run &r) override {
    if (resume_ == "latest" && r.checkpoint_dir.empty()) {
      throw CLI::ValidationError("--resume latest", "needs --checkpoint-dir");
    }
    if (!resume_.empty() && resume_ != "latest" && r.world->size() > 1) {
      throw CLI::ValidationError("--resume", "takes latest with more than one rank");
    }
  }

  void attach(Run &r, const Space &) override {
    auto &trainer = *r.trainer;
    if (r.profile) {
      trainer.add_callback(std::make_shared<kat::train::Profiler<Scalar, Mem>>());
      for (const auto &c : kat::train::Profiler<Scalar, Mem>::columns()) {
        r.columns.push_back(c);
      }
    }
    trainer.add_callback(std::make_shared<kat::train::ConsoleLogger<Scalar, Mem>>(
        r.root, progress_ == "always" || (progress_ == "auto" && isatty(fileno(stdout)))));
    trainer.add_callback(std::make_shared<kat::train::MetricsWriter<Scalar, Mem>>(
        r.root ? metrics_ : std::string(), r.columns));
    if (!r.checkpoint_dir.empty()) {
      checkpointer_ = std::make_shared<kat::train::Checkpointer<Scalar, Mem>>(
          r.checkpoint_dir, r.checkpoint_every, keep_, *r.group);
      trainer.add_callback(checkpointer_);
    }
  }

  void start(Run &r) override {
    if (resume_.empty()) {
      return;
    }
    const std::string path = resume_ == "latest" ? checkpointer_->latest() : resume_;
    kat::train::resume(*r.trainer, path);
    if (r.root) {
      const auto &p = r.trainer->position();
      std::printf("resumed from %s: step %lld, epoch %lld, batch %lld\n", path.c_str(),
                  static_cast<long long>(p.step), static_cast<long long>(p.epoch),
                  static_cast<long long>(p.batch));
    }
  }

private:
  std::string metrics_, progress_ = "auto", resume_;
  std::size_t keep_ = 3;
  std::shared_ptr<kat::train::Checkpointer<Scalar, Mem>> checkpointer_;
};
const auto component = register_component<Output>(70);

} // namespace
} // namespace kat_train
