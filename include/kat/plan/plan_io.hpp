#pragma once
/// @file
/// @brief kat::plan::write_plan / read_plan: a Plan as JSON (nlohmann/json), the file kat_plan
/// writes and the tensor-parallel executor reads (docs/tensor_parallel.md describes the
/// fields). The only kat::plan header that needs nlohmann/json (Debian nlohmann-json3-dev), so
/// kat/kat.hpp does not include it.

#include "kat/core/error.hpp"
#include "kat/plan/cost_model.hpp"
#include "kat/plan/plan.hpp"
#include "kat/plan/strategy.hpp"

#include <nlohmann/json.hpp>

#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>
#include <sstream>
#include <string>
#include <type_traits>

namespace kat::plan {

/// The "format" field of a plan file.
constexpr const char *plan_format = "kat-plan";
/// The "version" field this code writes and reads.
constexpr int plan_format_version = 1;

namespace detail {

inline nlohmann::json memory_to_json(const MemoryBreakdown &m) {
  return {{"parameters", m.parameters},
          {"gradients", m.gradients},
          {"optimizer", m.optimizer},
          {"activations", m.activations},
          {"total", m.total()}};
}

inline MemoryBreakdown memory_from_json(const nlohmann::json &j) {
  MemoryBreakdown m;
  m.parameters = j.at("parameters").get<double>();
  m.gradients = j.at("gradients").get<double>();
  m.optimizer = j.at("optimizer").get<double>();
  m.activations = j.at("activations").get<double>();
  return m;
}

/// The integer field `key` of `j` as T: a JSON integer (a float such as 1.5 or 1e300 is not
/// one) within T's range, so that nothing is truncated, wrapped or converted with undefined
/// behaviour (nlohmann's get<T>() casts without checking).
/// @throws FormatError naming the field, T's range and the value otherwise; nlohmann's
///   out_of_range if `key` is missing
template <class T> T integer_at(const nlohmann::json &j, const char *key) {
  static_assert(std::is_integral_v<T> && sizeof(T) <= sizeof(std::int64_t));
  using Limits = std::numeric_limits<T>;
  const nlohmann::json &v = j.at(key);
  if (v.is_number_unsigned()) {
    const auto u = v.get<std::uint64_t>();
    if (u <= static_cast<std::uint64_t>(Limits::max())) {
      return static_cast<T>(u);
    }
  } else if (v.is_number_integer()) {
    const auto i = v.get<std::int64_t>();
    if (Limits::is_signed ? (i >= static_cast<std::int64_t>(Limits::min()) &&
                             i <= static_cast<std::int64_t>(Limits::max()))
                          : i >= 0) {
      return static_cast<T>(i);
    }
  }
  throw FormatError(kat::detail::concat("\"", key, "\" must be an integer in [", +Limits::min(),
                                        ", ", +Limits::max(), "], got ", v.dump()));
}

// JSON has no infinity: an infinite value is written as null.
inline nlohmann::json number_or_null(double x) {
  return std::isfinite(x) ? nlohmann::json(x) : nlohmann::json(nullptr);
}
inline double number_or_infinity(const nlohmann::json &j) {
  return j.is_null() ? std::numeric_limits<double>::infinity() : j.get<double>();
}

template <class Enum, std::size_t N>
Enum enum_from_string(const std::string &text, const Enum (&values)[N], const char *what) {
  std::string known;
  for (const Enum v : values) {
    if (text == to_string(v)) {
      return v;
    }
    known += (known.empty() ? "" : ", ") + std::string(to_string(v));
  }
  throw FormatError(kat::detail::concat("unknown ", what, " '", text, "' (known: ", known, ")"));
}

inline Layout layout_from_json(const nlohmann::json &j) {
  static constexpr Layout all[] = {Layout::replicated, Layout::sharded, Layout::partial,
                                   Layout::batch};
  return enum_from_string(j.get<std::string>(), all, "layout");
}

} // namespace detail

/// The JSON form of a plan: format, version, model, mesh {data, tensor}, cluster, dtype_bytes,
/// optimizer {states, state_bytes}, predicted {step_seconds, compute_seconds,
/// communication_seconds, bytes_per_device, memory_bytes {parameters, gradients, optimizer,
/// activations, total}, memory_budget, feasible}, search {...}, operators [{name, type,
/// strategy, inputs [layouts], output, shard_groups, compute_seconds, communication_seconds,
/// memory_bytes}], collectives [{op, tensor, kind, pass, group, ranks, bytes, volume, seconds,
/// what}]. Numbers round-trip exactly.
inline nlohmann::json plan_to_json(const Plan &p) {
  using nlohmann::json;
  json j;
  j["format"] = plan_format;
  j["version"] = plan_format_version;
  j["model"] = p.model;
  j["mesh"] = {{"data", p.mesh.data}, {"tensor", p.mesh.tensor}};
  j["cluster"] = p.cluster;
  j["dtype_bytes"] = p.dtype_bytes;
  j["optimizer"] = {{"states", p.optimizer.states}, {"state_bytes", p.optimizer.state_bytes}};
  const Prediction &pr = p.predicted;
  j["predicted"] = {{"step_seconds", pr.step_seconds},
                    {"compute_seconds", pr.compute_seconds},
                    {"communication_seconds", pr.communication_seconds},
                    {"bytes_per_device", pr.bytes_per_device},
                    {"memory_bytes", detail::memory_to_json(pr.memory)},
                    {"memory_budget", pr.memory_budget},
                    {"feasible", pr.feasible}};
  const SearchInfo &s = p.search;
  j["search"] = {{"method", s.method},
                 {"seconds", s.seconds},
                 {"fold_depth", s.fold_depth},
                 {"unique_blocks", s.unique_blocks},
                 {"block_instances", s.block_instances},
                 {"loose_operators", s.loose_operators},
                 {"passes", s.passes},
                 {"lambda", detail::number_or_null(s.lambda)},
                 {"dp_step_seconds", s.dp_step_seconds},
                 {"combinations", s.combinations}};
  json ops = json::array();
  for (const auto &o : p.operators) {
    json inputs = json::array();
    for (const auto l : o.inputs) {
      inputs.push_back(to_string(l));
    }
    ops.push_back({{"name", o.name},
                   {"type", o.type},
                   {"strategy", o.strategy},
                   {"inputs", inputs},
                   {"output", to_string(o.output)},
                   {"shard_groups", o.shard_groups},
                   {"compute_seconds", o.compute_seconds},
                   {"communication_seconds", o.communication_seconds},
                   {"memory_bytes", detail::memory_to_json(o.memory)}});
  }
  j["operators"] = std::move(ops);
  json collectives = json::array();
  for (const auto &c : p.collectives) {
    collectives.push_back({{"op", c.op},
                           {"tensor", c.tensor},
                           {"kind", to_string(c.kind)},
                           {"pass", to_string(c.pass)},
                           {"group", to_string(c.group)},
                           {"ranks", c.ranks},
                           {"bytes", c.bytes},
                           {"volume", c.volume},
                           {"seconds", c.seconds},
                           {"what", c.what}});
  }
  j["collectives"] = std::move(collectives);
  return j;
}

/// The plan in `j` (plan_to_json's form).
/// @throws FormatError naming the problem for another format or version, a missing field, a
///   field of the wrong type, or an unknown layout, collective kind, pass or group
inline Plan plan_from_json(const nlohmann::json &j) {
  const char *who = "kat::plan::plan_from_json";
  try {
    if (!j.is_object() || j.value("format", std::string()) != plan_format) {
      throw FormatError(kat::detail::concat("\"format\" must be \"", plan_format, "\""));
    }
    const int version = detail::integer_at<int>(j, "version");
    if (version != plan_format_version) {
      throw FormatError(
          kat::detail::concat("\"version\" must be ", plan_format_version, ", got ", version));
    }
    Plan p;
    p.model = j.at("model").get<std::string>();
    p.mesh.data = detail::integer_at<int>(j.at("mesh"), "data");
    p.mesh.tensor = detail::integer_at<int>(j.at("mesh"), "tensor");
    if (p.mesh.data < 1 || p.mesh.tensor < 1) {
      throw FormatError(kat::detail::concat("mesh extents must be >= 1, got data ", p.mesh.data,
                                            ", tensor ", p.mesh.tensor));
    }
    p.cluster = j.at("cluster").get<std::string>();
    p.dtype_bytes = detail::integer_at<std::int64_t>(j, "dtype_bytes");
    p.optimizer.states = j.at("optimizer").at("states").get<double>();
    p.optimizer.state_bytes = j.at("optimizer").at("state_bytes").get<double>();
    const auto &pr = j.at("predicted");
    p.predicted.step_seconds = pr.at("step_seconds").get<double>();
    p.predicted.compute_seconds = pr.at("compute_seconds").get<double>();
    p.predicted.communication_seconds = pr.at("communication_seconds").get<double>();
    p.predicted.bytes_per_device = pr.at("bytes_per_device").get<double>();
    p.predicted.memory = detail::memory_from_json(pr.at("memory_bytes"));
    p.predicted.memory_budget = pr.at("memory_budget").get<double>();
    p.predicted.feasible = pr.at("feasible").get<bool>();
    const auto &s = j.at("search");
    p.search.method = s.at("method").get<std::string>();
    p.search.seconds = s.at("seconds").get<double>();
    p.search.fold_depth = detail::integer_at<int>(s, "fold_depth");
    p.search.unique_blocks = detail::integer_at<std::size_t>(s, "unique_blocks");
    p.search.block_instances = detail::integer_at<std::size_t>(s, "block_instances");
    p.search.loose_operators = detail::integer_at<std::size_t>(s, "loose_operators");
    p.search.passes = detail::integer_at<int>(s, "passes");
    p.search.lambda = detail::number_or_infinity(s.at("lambda"));
    p.search.dp_step_seconds = s.at("dp_step_seconds").get<double>();
    p.search.combinations = s.at("combinations").get<double>();
    for (const auto &o : j.at("operators")) {
      OpPlan op;
      op.name = o.at("name").get<std::string>();
      op.type = o.at("type").get<std::string>();
      op.strategy = o.at("strategy").get<std::string>();
      for (const auto &l : o.at("inputs")) {
        op.inputs.push_back(detail::layout_from_json(l));
      }
      op.output = detail::layout_from_json(o.at("output"));
      op.shard_groups = detail::integer_at<int>(o, "shard_groups");
      op.compute_seconds = o.at("compute_seconds").get<double>();
      op.communication_seconds = o.at("communication_seconds").get<double>();
      op.memory = detail::memory_from_json(o.at("memory_bytes"));
      p.operators.push_back(std::move(op));
    }
    static constexpr CollectiveKind kinds[] = {
        CollectiveKind::all_reduce, CollectiveKind::all_gather, CollectiveKind::reduce_scatter,
        CollectiveKind::all_to_all};
    static constexpr Pass passes[] = {Pass::forward, Pass::backward};
    static constexpr Group groups[] = {Group::tensor, Group::data, Group::data_tensor};
    for (const auto &c : j.at("collectives")) {
      Collective k;
      k.op = c.at("op").get<std::string>();
      k.tensor = c.at("tensor").get<std::string>();
      k.kind = detail::enum_from_string(c.at("kind").get<std::string>(), kinds, "collective kind");
      k.pass = detail::enum_from_string(c.at("pass").get<std::string>(), passes, "pass");
      k.group = detail::enum_from_string(c.at("group").get<std::string>(), groups, "group");
      k.ranks = detail::integer_at<int>(c, "ranks");
      k.bytes = c.at("bytes").get<double>();
      k.volume = c.at("volume").get<double>();
      k.seconds = c.at("seconds").get<double>();
      k.what = c.at("what").get<std::string>();
      p.collectives.push_back(std::move(k));
    }
    return p;
  } catch (const FormatError &e) {
    throw FormatError(kat::detail::concat(who, ": ", e.what()));
  } catch (const nlohmann::json::exception &e) {
    throw FormatError(kat::detail::concat(who, ": ", e.what()));
  }
}

/// Writes plan_to_json(p) to `path`, indented: to `path`.tmp first, renamed to `path` once
/// every byte is written and the file closed, so `path` is never a partial plan.
/// @throws IOError naming the file and the system's reason when it cannot be created, written
///   (a full disk), closed or renamed; the temporary file is removed then.
inline void write_plan(const Plan &p, const std::string &path) {
  const std::string text = plan_to_json(p).dump(2) + '\n';
  const std::string tmp = path + ".tmp";
  const auto fail = [&](const char *step, int error) {
    std::remove(tmp.c_str());
    throw IOError(kat::detail::concat("kat::plan::write_plan: cannot write '", path, "' (", step,
                                      " '", tmp,
                                      "'): ", error != 0 ? std::strerror(error) : "failed"));
  };
  errno = 0;
  std::FILE *out = std::fopen(tmp.c_str(), "w");
  if (out == nullptr) {
    fail("creating", errno);
  }
  const bool wrote = std::fwrite(text.data(), 1, text.size(), out) == text.size() &&
                     std::fflush(out) == 0 && std::ferror(out) == 0;
  const int write_errno = errno;
  const bool closed = std::fclose(out) == 0; // a failed close is a failed write too
  if (!wrote || !closed) {
    fail("writing", !wrote ? write_errno : errno);
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    fail("renaming", errno);
  }
}

/// Reads a plan written by write_plan.
/// @throws IOError naming the path when it cannot be read; FormatError (with the path) when it
///   is not valid JSON or not a plan (plan_from_json)
inline Plan read_plan(const std::string &path) {
  std::ifstream in(path);
  if (!in) {
    throw IOError(kat::detail::concat("kat::plan::read_plan: cannot open '", path, "'"));
  }
  std::stringstream text;
  text << in.rdbuf();
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text.str());
  } catch (const nlohmann::json::exception &e) {
    throw FormatError(
        kat::detail::concat("kat::plan::read_plan: '", path, "' is not valid JSON: ", e.what()));
  }
  try {
    return plan_from_json(j);
  } catch (const FormatError &e) {
    throw FormatError(kat::detail::concat("kat::plan::read_plan: '", path, "': ", e.what()));
  }
}

} // namespace kat::plan
