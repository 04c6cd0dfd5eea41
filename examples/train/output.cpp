// What a run leaves behind and shows: the console (--progress), per-epoch metrics (--metrics),
// the profile (--profile), checkpoints (--checkpoint-*) and resuming from one (--resume), and
// the run's identity that ties its checkpoints to it (docs/checkpoints.md).
#include "run.hpp"

#include <kat/io/checkpoint.hpp>
#include <kat/train/checkpointer.hpp>
#include <kat/train/console_logger.hpp>
#include <kat/train/metrics_writer.hpp>
#include <kat/train/profiler.hpp>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <set>
#include <unistd.h>

namespace kat_train {
namespace {

// Options that do not define the experiment: a resumed run may give them other values (the
// changes are printed). Options that only say where to find things are not stored at all.
const std::set<std::string> changeable = {
    "epochs", "checkpoint-every", "keep-checkpoints", "progress", "metrics", "profile", "data-dir"};
const std::set<std::string> not_stored = {"help", "resume", "checkpoint-dir",
                                          "overwrite-checkpoints"};

// Every option of `app` and its option groups as "name" -> its text (the default if not
// given; flags "true" or "false"), in declaration order.
void collect(const CLI::App &app, std::vector<std::pair<std::string, std::string>> &out) {
  for (const CLI::Option *o : app.get_options()) {
    if (o->get_lnames().empty() || not_stored.count(o->get_lnames().front()) > 0) {
      continue;
    }
    std::string value;
    if (o->get_expected_max() == 0) {
      value = o->count() > 0 ? "true" : "false";
    } else if (o->count() > 0) {
      for (const auto &v : o->results()) {
        value += (value.empty() ? "" : ",") + v;
      }
    } else {
      value = o->get_default_str();
    }
    out.emplace_back(o->get_lnames().front(), value);
  }
  for (const CLI::App *sub : app.get_subcommands([](const CLI::App *) { return true; })) {
    collect(*sub, out);
  }
}

std::string shown(const std::optional<std::string> &v) {
  return !v ? "(not stored)" : v->empty() ? "(not given)" : *v;
}

// The rows of an earlier run's metrics file at `path` for epochs before `first_epoch` (and a
// CSV header), written back in its place (temporary file, renamed); false if there is none.
bool trim_metrics(const std::string &path, std::int64_t first_epoch, std::size_t &kept,
                  std::size_t &dropped) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return false;
  }
  const bool csv = path.size() >= 4 && path.compare(path.size() - 4, 4, ".csv") == 0;
  std::string text, line;
  std::size_t number = 0;
  kept = dropped = 0;
  while (std::getline(in, line)) {
    ++number;
    if (in.eof()) { // a last line without its newline: an interrupted write
      ++dropped;
      break;
    }
    if (csv && number == 1) {
      if (line.compare(0, 6, "epoch,") != 0) {
        throw kat::ValueError("--metrics " + path + ": line 1 is not a metrics header: '" + line +
                              "'");
      }
      text += line + '\n';
      continue;
    }
    const std::string prefix = csv ? "" : "{\"epoch\": ";
    const char *start = line.c_str() + std::min(prefix.size(), line.size());
    char *end = nullptr;
    errno = 0;
    const long long epoch = std::strtoll(start, &end, 10);
    if (line.compare(0, prefix.size(), prefix) != 0 || end == start || errno != 0 || *end != ',') {
      throw kat::ValueError(kat::detail::concat("--metrics ", path, ": line ", number,
                                                " is not a metrics row of kat_train: '", line,
                                                "'"));
    }
    if (epoch < first_epoch) {
      text += line + '\n';
      ++kept;
    } else {
      ++dropped;
    }
  }
  if (in.bad()) {
    throw kat::IOError("--metrics " + path + ": read error");
  }
  const std::string tmp = path + ".tmp-" + std::to_string(::getpid());
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << text;
    out.flush();
    if (!out) {
      std::remove(tmp.c_str());
      throw kat::IOError("--metrics " + path + ": cannot write " + tmp);
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string reason = std::strerror(errno);
    std::remove(tmp.c_str());
    throw kat::IOError("--metrics " + path + ": cannot rename " + tmp + ": " + reason);
  }
  return true;
}

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
    r.app.add_flag("--overwrite-checkpoints", overwrite_,
                   "Delete the checkpoints of other runs in --checkpoint-dir instead of refusing "
                   "it");
  }

  void check(Run &r) override {
    if (resume_ == "latest" && r.checkpoint_dir.empty()) {
      throw CLI::ValidationError("--resume latest", "needs --checkpoint-dir");
    }
    if (!resume_.empty() && resume_ != "latest" && r.world->size() > 1) {
      throw CLI::ValidationError("--resume", "takes latest with more than one rank");
    }
    if (overwrite_ && r.checkpoint_dir.empty()) {
      throw CLI::ValidationError("--overwrite-checkpoints", "needs --checkpoint-dir");
    }
  }

  void attach(Run &r, const Space &) override {
    auto &trainer = *r.trainer;
    kat::train::RunIdentity run;
    collect(r.app, run.config);
    if (!r.checkpoint_dir.empty()) {
      checkpointer_ = std::make_shared<kat::train::Checkpointer<Scalar, Mem>>(
          r.checkpoint_dir, r.checkpoint_every, keep_, *r.group);
    }
    if (!resume_.empty()) {
      path_ = resume_ == "latest" ? checkpointer_->latest() : resume_;
      header_ = kat::io::read_checkpoint_header(path_);
      run.id = check_identity(run.config);
    } else {
      run.id = shared_run_id(*r.group);
    }
    run_id_ = run.id;
    if (checkpointer_) {
      checkpointer_->set_run(run);
      refuse_or_delete_foreign(r);
    }

    if (r.profile) {
      trainer.add_callback(std::make_shared<kat::train::Profiler<Scalar, Mem>>());
      for (const auto &c : kat::train::Profiler<Scalar, Mem>::columns()) {
        r.columns.push_back(c);
      }
    }
    trainer.add_callback(std::make_shared<kat::train::ConsoleLogger<Scalar, Mem>>(
        r.root, progress_ == "always" || (progress_ == "auto" && isatty(fileno(stdout)))));
    bool append = false;
    if (r.root && !metrics_.empty() && header_) {
      // Rows of the epochs the checkpoint has not finished are dropped: the resumed run
      // writes them again, so the file holds each epoch once, as a run never stopped would.
      append = trim_metrics(metrics_, stored_epoch(), metrics_kept_, metrics_dropped_);
    }
    trainer.add_callback(std::make_shared<kat::train::MetricsWriter<Scalar, Mem>>(
        r.root ? metrics_ : std::string(), r.columns, append));
    metrics_appended_ = append;
    if (checkpointer_) {
      trainer.add_callback(checkpointer_);
    }
  }

  void describe(Run &r) override {
    std::printf("run %s%s\n", run_id_.c_str(), header_ ? " (resumed)" : "");
    for (const auto &line : changes_) {
      std::printf("%s\n", line.c_str());
    }
    if (metrics_appended_) {
      std::printf("metrics: appending to %s: kept %zu rows, dropped %zu rows of epochs from %lld "
                  "on\n",
                  metrics_.c_str(), metrics_kept_, metrics_dropped_,
                  static_cast<long long>(stored_epoch()));
    }
    if (deleted_ > 0) {
      std::printf("deleted %zu checkpoint(s) of other runs in %s (--overwrite-checkpoints)\n",
                  deleted_, r.checkpoint_dir.c_str());
    }
  }

  void start(Run &r) override {
    if (resume_.empty()) {
      return;
    }
    kat::train::resume(*r.trainer, path_);
    if (r.root) {
      const auto &p = r.trainer->position();
      std::printf("resumed from %s: step %lld, epoch %lld, batch %lld\n", path_.c_str(),
                  static_cast<long long>(p.step), static_cast<long long>(p.epoch),
                  static_cast<long long>(p.batch));
    }
  }

private:
  // The epoch the checkpoint continues at (its metadata "epoch").
  std::int64_t stored_epoch() const {
    const std::string text = header_->find("epoch").value_or("");
    char *end = nullptr;
    errno = 0;
    const long long epoch = std::strtoll(text.c_str(), &end, 10);
    if (text.empty() || *end != '\0' || errno != 0 || epoch < 1) {
      throw kat::ValueError("--resume " + path_ +
                            ": its metadata 'epoch' must be an integer >= 1, got '" + text + "'");
    }
    return epoch;
  }

  // Rank 0's new run id, on every rank of `group`.
  static std::string shared_run_id(const kat::train::ProcessGroup &group) {
    const std::string mine = kat::io::new_run_id();
    const std::uint64_t v = std::strtoull(mine.c_str(), nullptr, 16);
    const auto part = [&](std::uint64_t half) {
      return static_cast<std::uint64_t>(
          group.min(group.rank() == 0 ? static_cast<std::int64_t>(half) : std::int64_t(1) << 40));
    };
    const std::uint64_t id = (part(v >> 32) << 32) | part(v & 0xffffffffu);
    char s[17];
    std::snprintf(s, sizeof s, "%016llx", static_cast<unsigned long long>(id));
    return s;
  }

  // Compares the checkpoint's stored configuration with this run's: refuses a changed option
  // that defines the experiment, notes the changed ones that may change. Returns the run id.
  std::string check_identity(const std::vector<std::pair<std::string, std::string>> &now) {
    const std::string where = "--resume " + path_;
    if (header_->version < 2) {
      throw kat::ValueError(kat::detail::concat(
          where, ": the checkpoint has format version ", header_->version,
          ", written before checkpoints held their run id and configuration, which a resumed "
          "run must check; continue it with the KAT that wrote it, or start a new run"));
    }
    const kat::train::RunIdentity stored = kat::train::stored_identity(*header_);
    if (stored.id.empty() || stored.config.empty()) {
      throw kat::ValueError(where + ": the checkpoint holds no run id and configuration "
                                    "(metadata \"run\" and \"config.*\"): it was not written "
                                    "by kat_train");
    }
    const auto find = [](const std::vector<std::pair<std::string, std::string>> &c,
                         const std::string &key) -> std::optional<std::string> {
      for (const auto &kv : c) {
        if (kv.first == key) {
          return kv.second;
        }
      }
      return std::nullopt;
    };
    std::vector<std::string> keys;
    for (const auto &kv : now) {
      keys.push_back(kv.first);
    }
    for (const auto &kv : stored.config) {
      if (!find(now, kv.first)) {
        keys.push_back(kv.first);
      }
    }
    std::string refused;
    for (const auto &key : keys) {
      const auto before = find(stored.config, key), after = find(now, key);
      if (before == after) {
        continue;
      }
      if (changeable.count(key) > 0) {
        changes_.push_back("resume: --" + key + " changed from " + shown(before) + " to " +
                           shown(after));
      } else {
        refused += kat::detail::concat(refused.empty() ? "" : "; ", "--", key, " was ",
                                       shown(before), ", this run has ", shown(after));
      }
    }
    if (!refused.empty()) {
      std::string allowed;
      for (const auto &c : changeable) {
        allowed += (allowed.empty() ? "--" : ", --") + c;
      }
      throw kat::ValueError(kat::detail::concat(
          where, ": run ", stored.id, " was started with other options: ", refused, ". Only ",
          allowed,
          " may change on resume; to train with other options, start a new run in a new "
          "--checkpoint-dir"));
    }
    return stored.id;
  }

  // A directory holding another run's checkpoints is refused (its pruning and --resume
  // latest would mix the runs), or emptied of them with --overwrite-checkpoints.
  void refuse_or_delete_foreign(Run &r) {
    const auto others = checkpointer_->foreign();
    if (others.empty()) {
      return;
    }
    if (!overwrite_) {
      std::set<std::string> runs;
      for (const auto &f : others) {
        runs.insert(f.usable() ? (f.run.empty() ? "(anonymous)" : f.run)
                               : "(unreadable: " + f.name + ")");
      }
      std::string list;
      for (const auto &id : runs) {
        list += (list.empty() ? "" : ", ") + id;
      }
      throw kat::ValueError(kat::detail::concat(
          "--checkpoint-dir ", r.checkpoint_dir, " holds ", others.size(),
          " checkpoint(s) of another run (run ", list, ", e.g. ", others.front().name,
          "), not of run ", run_id_, header_ ? std::string() : " (this new run)",
          ": use another --checkpoint-dir, --resume latest to continue that run, or "
          "--overwrite-checkpoints to delete them"));
    }
    for (const auto &f : others) {
      if (::unlink(f.path.c_str()) != 0 && errno != ENOENT) {
        throw kat::IOError(kat::detail::concat("--overwrite-checkpoints: cannot delete ", f.path,
                                               ": ", std::strerror(errno)));
      }
      ++deleted_;
    }
  }

  std::string metrics_, progress_ = "auto", resume_;
  std::size_t keep_ = 3;
  bool overwrite_ = false;
  std::shared_ptr<kat::train::Checkpointer<Scalar, Mem>> checkpointer_;
  std::string path_, run_id_;                       // the checkpoint resumed from; the run
  std::optional<kat::io::CheckpointHeader> header_; // its header
  std::vector<std::string> changes_;                // changed options that may change
  std::size_t metrics_kept_ = 0, metrics_dropped_ = 0, deleted_ = 0;
  bool metrics_appended_ = false;
};
const auto output = register_component<Output>(70);

} // namespace
} // namespace kat_train
