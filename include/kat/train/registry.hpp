#pragma once
/// @file
/// @brief Named components with their options, so a program (a command line, a config file)
/// can offer every registered method without knowing it.

#include "kat/core/error.hpp"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace kat::train {

/// The numbers an option accepts: an interval of reals or of integers, each end open, closed
/// or absent. Programs print describe() in their help and refuse a value outside it before
/// anything is built from it (check_option_value).
struct OptionRange {
  bool integer = false;  ///< whole numbers only (parsed as signed 64-bit integers)
  double lo = -HUGE_VAL; ///< the lower end; -HUGE_VAL: none
  double hi = HUGE_VAL;  ///< the upper end; HUGE_VAL: none
  bool lo_open = false;  ///< whether lo itself is excluded
  bool hi_open = false;  ///< whether hi itself is excluded

  /// Reals x > lo.
  static OptionRange greater_than(double lo) { return {false, lo, HUGE_VAL, true, false}; }
  /// Reals x >= lo.
  static OptionRange at_least(double lo) { return {false, lo, HUGE_VAL, false, false}; }
  /// Reals lo <= x < hi.
  static OptionRange half_open(double lo, double hi) { return {false, lo, hi, false, true}; }
  /// Reals lo <= x <= hi.
  static OptionRange closed(double lo, double hi) { return {false, lo, hi, false, false}; }
  /// Integers n >= lo.
  static OptionRange integer_at_least(std::int64_t lo) {
    return {true, static_cast<double>(lo), HUGE_VAL, false, false};
  }

  /// Whether `v` (finite, and whole if integer) lies in the range.
  bool contains(double v) const {
    return std::isfinite(v) && (lo_open ? v > lo : v >= lo) && (hi_open ? v < hi : v <= hi) &&
           (!integer || std::floor(v) == v);
  }
  /// "a number > 0", "a number in [0, 1)", "an integer >= 1", ...
  std::string describe() const {
    const auto num = [](double x) {
      char b[32];
      std::snprintf(b, sizeof b, "%.17g", x);
      return std::string(b);
    };
    const std::string what = integer ? "an integer" : "a number";
    const bool has_lo = std::isfinite(lo), has_hi = std::isfinite(hi);
    if (has_lo && has_hi) {
      return what + " in " + (lo_open ? "(" : "[") + num(lo) + ", " + num(hi) +
             (hi_open ? ")" : "]");
    }
    if (has_lo) {
      return what + (lo_open ? " > " : " >= ") + num(lo);
    }
    if (has_hi) {
      return what + (hi_open ? " < " : " <= ") + num(hi);
    }
    return integer ? "an integer" : "a finite number";
  }
};

/// One option of a registered component, as a command line offers it ("--damping").
struct OptionSpec {
  /// Builds an option; the trailing underscores only keep the parameters apart from the members.
  OptionSpec(std::string name_, std::string help_, std::string default_value_ = "",
             std::vector<std::string> choices_ = {}, bool is_flag_ = false)
      : name(std::move(name_)), help(std::move(help_)), default_value(std::move(default_value_)),
        choices(std::move(choices_)), is_flag(is_flag_) {}
  std::string name;                 ///< without dashes: "damping", "factor-update-steps"
  std::string help;                 ///< one sentence; the UI adds the default and the choices
  std::string default_value;        ///< as text; "" for none
  std::vector<std::string> choices; ///< the values allowed; empty: any
  bool is_flag = false;             ///< takes no value: "true" when given, absent otherwise
  std::optional<OptionRange> range; ///< the numbers allowed; none: not checked here

  /// This option with `r` as its range.
  OptionSpec within(OptionRange r) const {
    OptionSpec s = *this;
    s.range = r;
    return s;
  }
};

/// Why `text` is not a valid value of `spec` ("must be a number > 0, got '-1'"), or "" when it
/// is (always, for an option without a range). Integers are parsed whole as signed 64-bit
/// numbers, reals as finite doubles; nothing is clamped or rounded.
inline std::string option_value_error(const OptionSpec &spec, const std::string &text) {
  if (!spec.range) {
    return "";
  }
  const OptionRange &r = *spec.range;
  char *end = nullptr;
  errno = 0;
  double v = 0;
  if (r.integer) {
    v = static_cast<double>(std::strtoll(text.c_str(), &end, 10));
  } else {
    v = std::strtod(text.c_str(), &end);
  }
  const bool parsed = !text.empty() && end != nullptr && *end == '\0' && errno == 0;
  if (parsed && r.contains(v)) {
    return "";
  }
  return "must be " + r.describe() + ", got '" + text + "'";
}

/// Checks `text` against `spec` (option_value_error).
/// @throws ValueError "option --NAME must be <range>, got '<text>'" when it is not valid.
inline void check_option_value(const OptionSpec &spec, const std::string &text) {
  const std::string why = option_value_error(spec, text);
  if (!why.empty()) {
    throw ValueError("option --" + spec.name + " " + why);
  }
}

/// Option values by name, as text (what a command line gives), with typed reads whose
/// errors name the option as the user wrote it.
class Config {
public:
  /// Sets option `name` to `value`.
  void set(const std::string &name, std::string value) { values_[name] = std::move(value); }
  /// Whether option `name` has a value.
  bool has(const std::string &name) const { return values_.count(name) > 0; }
  /// The text of option `name`. @throws ValueError if it has no value.
  const std::string &text(const std::string &name) const {
    const auto it = values_.find(name);
    if (it == values_.end()) {
      throw ValueError("option --" + name + " is needed here and has no default: give it");
    }
    return it->second;
  }
  /// Option `name` as a finite number. @throws ValueError naming it and the text otherwise.
  double number(const std::string &name) const {
    const std::string &t = text(name);
    char *end = nullptr;
    errno = 0;
    const double v = std::strtod(t.c_str(), &end);
    if (t.empty() || *end != '\0' || errno != 0 || !std::isfinite(v)) {
      throw ValueError("option --" + name + " must be a finite number, got '" + t + "'");
    }
    return v;
  }
  /// Option `name` as an integer. @throws ValueError naming it and the text otherwise.
  std::int64_t integer(const std::string &name) const {
    const std::string &t = text(name);
    char *end = nullptr;
    errno = 0;
    const long long v = std::strtoll(t.c_str(), &end, 10);
    if (t.empty() || *end != '\0' || errno != 0) {
      throw ValueError("option --" + name + " must be an integer, got '" + t + "'");
    }
    return v;
  }
  /// Option `name` as a flag ("true"/"false"; a missing flag is false).
  bool flag(const std::string &name) const { return has(name) && text(name) == "true"; }
  /// Option `name` split at commas (no value or "" is the empty list).
  std::vector<std::string> list(const std::string &name) const {
    std::vector<std::string> out;
    if (!has(name)) {
      return out;
    }
    const std::string &t = text(name);
    for (std::size_t start = 0; !t.empty() && start <= t.size();) {
      const std::size_t comma = std::min(t.find(',', start), t.size());
      out.push_back(t.substr(start, comma - start));
      start = comma + 1;
    }
    return out;
  }

private:
  std::map<std::string, std::string> values_;
};

/// A family of interchangeable components (models, optimizers, gradient transforms,
/// distributed strategies, schedules) by name: each entry is its name, a one-line help, the
/// options it reads and a factory. Adding a method to a program built on registries is one
/// add() call.
///
/// @tparam Factory what builds one (a std::function of the program's choosing)
template <class Factory> class Registry {
public:
  /// A registered component.
  struct Entry {
    std::string name;                ///< the name a program selects it by
    std::string help;                ///< one line for the help text
    std::vector<OptionSpec> options; ///< the options it reads
    Factory make;                    ///< builds one
  };

  /// @param what what the entries are ("optimizer"), for messages
  explicit Registry(std::string what) : what_(std::move(what)) {}

  /// Registers `name`. @throws ValueError if it is already registered.
  void add(std::string name, std::string help, std::vector<OptionSpec> options, Factory make) {
    if (find(name) != nullptr) {
      throw ValueError("kat::train::Registry: " + what_ + " '" + name + "' is already registered");
    }
    entries_.push_back({std::move(name), std::move(help), std::move(options), std::move(make)});
  }

  /// The entry `name`, or nullptr.
  const Entry *find(const std::string &name) const {
    for (const auto &e : entries_) {
      if (e.name == name) {
        return &e;
      }
    }
    return nullptr;
  }
  /// The entry `name`. @throws ValueError naming it and the registered names.
  const Entry &at(const std::string &name) const {
    if (const Entry *e = find(name)) {
      return *e;
    }
    std::string known;
    for (const auto &e : entries_) {
      known += (known.empty() ? "" : ", ") + e.name;
    }
    throw ValueError("unknown " + what_ + " '" + name + "' (registered: " + known + ")");
  }
  /// The registered names, in registration order.
  std::vector<std::string> names() const {
    std::vector<std::string> n;
    for (const auto &e : entries_) {
      n.push_back(e.name);
    }
    return n;
  }
  /// All entries, in registration order.
  const std::vector<Entry> &entries() const { return entries_; }
  /// What the entries are ("optimizer"), as given at construction.
  const std::string &what() const { return what_; }

private:
  std::string what_;
  std::vector<Entry> entries_;
};

} // namespace kat::train
