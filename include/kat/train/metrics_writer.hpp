#pragma once
/// @file
/// @brief A callback that writes one line of metrics per epoch, as CSV or JSON lines.

#include "kat/core/error.hpp"
#include "kat/core/views.hpp"
#include "kat/train/callback.hpp"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

namespace kat::train {

/// Writes each epoch's EpochSummary to a file: CSV (a header line first) when the name ends in
/// ".csv", JSON lines when it ends in ".jsonl" or ".json". Columns: epoch, wall_seconds,
/// samples_per_second, train_loss, test_loss, test_accuracy, lr, then the names of
/// `extra_columns` in that order, filled from EpochSummary::metrics (callbacks added before
/// this one put them there; a column none of them filled is written as 0). Whole lines only,
/// flushed every epoch: an interrupted run leaves no half line. Every write is checked: a
/// line that does not reach the file (a full disk, /dev/full) throws IOError naming the file
/// and the system's reason. Only the process that constructs it with a non-empty path writes;
/// give the others an empty path.
template <class Scalar = float, class MemorySpace = DefaultMemorySpace>
class MetricsWriter : public Callback<Scalar, MemorySpace> {
public:
  /// @param path           the output file; "" on the processes that write nothing
  /// @param extra_columns  the metrics (EpochSummary::metrics names) written after the fixed
  /// columns
  /// @param append  keep the file's lines and add to them (a resumed run); a CSV file's
  ///   header must then be the one this writer writes, and is not written again
  /// @throws ValueError if the name has another extension, or if appending to a CSV file with
  ///   another header (both named); IOError naming the file if it cannot be opened or the CSV
  ///   header cannot be written.
  explicit MetricsWriter(const std::string &path, std::vector<std::string> extra_columns = {},
                         bool append = false)
      : extra_(std::move(extra_columns)) {
    if (path.empty()) {
      return;
    }
    const auto ends_with = [&](const std::string &suffix) {
      return path.size() >= suffix.size() &&
             path.compare(path.size() - suffix.size(), suffix.size(), suffix) == 0;
    };
    if (ends_with(".csv")) {
      csv_ = true;
    } else if (!ends_with(".jsonl") && !ends_with(".json")) {
      throw ValueError("kat::train::MetricsWriter: the file name must end in .csv or .jsonl, "
                       "got '" +
                       path + "'");
    }
    std::string header =
        "epoch,wall_seconds,samples_per_second,train_loss,test_loss,test_accuracy,lr";
    for (const auto &c : extra_) {
      header += ',' + c;
    }
    bool empty = true;
    if (append) {
      std::ifstream in(path);
      std::string first;
      empty = !std::getline(in, first);
      if (csv_ && !empty && first != header) {
        throw ValueError("kat::train::MetricsWriter: cannot append to '" + path +
                         "': its header is '" + first + "', this run writes '" + header + "'");
      }
    }
    out_.reset(std::fopen(path.c_str(), append ? "a" : "w"));
    if (!out_) {
      throw IOError("kat::train::MetricsWriter: cannot open '" + path +
                    "' for writing: " + std::strerror(errno));
    }
    path_ = path;
    if (csv_ && empty) {
      write(header + '\n');
    }
  }

  /// The file written ("" on the processes that write nothing).
  const std::string &path() const { return path_; }

  std::string name() const override { return "metrics_writer"; }

  /// Writes the epoch's line and flushes it.
  /// @throws IOError naming the file if the line does not reach it.
  void on_epoch_end(Trainer<Scalar, MemorySpace> &, EpochSummary &s) override {
    if (!out_) {
      return;
    }
    char buf[320];
    if (csv_) {
      std::snprintf(buf, sizeof buf, "%lld,%.6f,%.1f,%.6f,%.6f,%.6f,%.6g",
                    static_cast<long long>(s.epoch), s.wall_seconds, s.samples_per_second,
                    s.train_loss, s.test_loss, s.test_accuracy, s.lr);
    } else {
      std::snprintf(buf, sizeof buf,
                    "{\"epoch\": %lld, \"wall_seconds\": %.6f, \"samples_per_second\": %.1f, "
                    "\"train_loss\": %.6f, \"test_loss\": %.6f, \"test_accuracy\": %.6f, "
                    "\"lr\": %.6g",
                    static_cast<long long>(s.epoch), s.wall_seconds, s.samples_per_second,
                    s.train_loss, s.test_loss, s.test_accuracy, s.lr);
    }
    std::string line = buf;
    for (const auto &column : extra_) {
      Metric m{column, 0.0, 6};
      for (const auto &given : s.metrics) {
        if (given.name == column) {
          m = given;
        }
      }
      if (csv_) {
        std::snprintf(buf, sizeof buf, ",%.*f", m.decimals, m.value);
      } else {
        std::snprintf(buf, sizeof buf, ", \"%s\": %.*f", m.name.c_str(), m.decimals, m.value);
      }
      line += buf;
    }
    line += csv_ ? "\n" : "}\n";
    write(line);
  }

private:
  struct Close {
    void operator()(std::FILE *f) const { std::fclose(f); } // every line was flushed and checked
  };

  /// Writes `text` and flushes it. @throws IOError naming the file and the reason on failure.
  void write(const std::string &text) {
    errno = 0;
    if (std::fwrite(text.data(), 1, text.size(), out_.get()) != text.size() ||
        std::fflush(out_.get()) != 0 || std::ferror(out_.get()) != 0) {
      const int e = errno;
      throw IOError("kat::train::MetricsWriter: writing '" + path_ +
                    "': " + (e != 0 ? std::strerror(e) : "write failed"));
    }
  }

  std::vector<std::string> extra_;
  std::unique_ptr<std::FILE, Close> out_;
  std::string path_;
  bool csv_ = false;
};

} // namespace kat::train
