// kat_plan: searches a tensor-parallel plan for a GPT-style model with kat::plan (TAP: Shi et
// al., arXiv 2302.00247) and compares it with Megatron-LM's expert plan under the same
// alpha-beta cost model.
//
//   kat_plan --gpt 24x1024 --heads 16 --seq 1024 --batch 8 --tp 4 --dp 2
//     --cluster gpu-cluster --memory-gib 80 --out plan.json   (one line)
//   kat_plan --preset gpt3-175b --tp 8
//
// Prints the folding (unique blocks and instances), the search time, the predicted step time,
// bytes communicated and memory per device of both plans, and each block's strategies; --out
// writes the plan as JSON for the executor (docs/tensor_parallel.md), --disable keeps the
// search off strategies the executor lacks.
#include <kat/nn/models.hpp>
#include <kat/plan/cost_model.hpp>
#include <kat/plan/folding.hpp>
#include <kat/plan/gpt.hpp>
#include <kat/plan/megatron.hpp>
#include <kat/plan/plan.hpp>
#include <kat/plan/plan_io.hpp>
#include <kat/plan/search.hpp>

#include "stdout_check.hpp"

#include <CLI/CLI.hpp>
#include <Kokkos_Core.hpp>

#include <cstdint>
#include <cstdio>
#include <exception>
#include <optional>
#include <regex>
#include <string>
#include <vector>

namespace {

using namespace kat::plan;

constexpr double gib = 1024.0 * 1024.0 * 1024.0;

// "24x1024" -> {24, 1024}; nullopt if malformed.
std::optional<std::pair<std::int64_t, std::int64_t>> parse_gpt(const std::string &text) {
  static const std::regex pattern("^([0-9]{1,6})x([0-9]{1,7})$");
  std::smatch m;
  if (!std::regex_match(text, m, pattern)) {
    return std::nullopt;
  }
  return std::make_pair(std::stoll(m[1]), std::stoll(m[2])); // <= 7 digits: no overflow
}

// Seconds of the operators inside blocks.
double block_seconds(const Plan &p, const Folding &f) {
  double s = 0;
  for (std::size_t i = 0; i < p.operators.size(); ++i) {
    if (f.instance_of_op[i] >= 0) {
      s += p.operators[i].compute_seconds + p.operators[i].communication_seconds;
    }
  }
  return s;
}

std::string short_name(const std::string &name, const std::string &scope) {
  return name.size() > scope.size() + 1 && name.compare(0, scope.size(), scope) == 0
             ? name.substr(scope.size() + 1)
             : name;
}

void print_row(const char *label, double a, const std::optional<double> &b, const char *format) {
  std::printf("  %-34s", label);
  std::printf(format, a);
  if (b) {
    std::printf(format, *b);
  } else {
    std::printf("%18s", "-");
  }
  std::printf("\n");
}

// The command line, and the steps main() takes with it.
struct Command {
  CLI::App app{"Search a tensor-parallel plan for a GPT-style model (kat::plan, TAP) and compare "
               "it with Megatron-LM's under the same alpha-beta cost model."};
  std::string gpt, preset, cluster_name = "gpu-cluster", optimizer = "adam", method = "folded";
  std::string out, megatron_out, vit;
  std::int64_t heads = 0, seq = 0, vocab = 0, ffn = 0, batch = 0, dtype_bytes = 0;
  int tp = 1, dp = 1, fold_depth = 0, patch = 7;
  double memory_gib = -1;
  std::vector<std::string> disabled;
  GptConfig config; // the model, once check() has read the flags

  void add_flags() {
    auto *gpt_opt = app.add_option("--gpt", gpt, "Blocks x hidden size, e.g. 24x1024");
    app.add_option(
           "--vit", vit,
           "Instead of a GPT: kat_train's ViT on 28x28 images (kat::nn::models::vit, "
           "described by Sequential::describe), blocks x width, e.g. 4x64; --heads "
           "(default 4), --ffn (default 2 x width), --patch, --batch (default 128); its plan "
           "is what kat_train --tensor-parallel --plan reads")
        ->excludes(gpt_opt);
    app.add_option("--patch", patch, "--vit: P x P patches (must divide 28)")
        ->check(CLI::IsMember({1, 2, 4, 7, 14, 28}))
        ->capture_default_str();
    std::string presets;
    for (const auto &n : gpt_preset_names()) {
      presets += (presets.empty() ? "" : " | ") + n;
    }
    auto *preset_opt = app.add_option("--preset", preset, "A named model: " + presets)
                           ->check(CLI::IsMember(gpt_preset_names()));
    gpt_opt->excludes(preset_opt);
    app.add_option("--heads", heads, "Attention heads (default: hidden / 64, or the preset's)")
        ->check(CLI::Range(std::int64_t(1), std::int64_t(1) << 40));
    app.add_option("--seq", seq, "Positions per sample (default 1024, or the preset's)")
        ->check(CLI::Range(std::int64_t(1), std::int64_t(1) << 40));
    app.add_option("--vocab", vocab, "Vocabulary (default 50304)")
        ->check(CLI::Range(std::int64_t(1), std::int64_t(1) << 40));
    app.add_option("--ffn", ffn, "MLP width (default 4 x hidden)")
        ->check(CLI::Range(std::int64_t(1), std::int64_t(1) << 40));
    app.add_option("--batch", batch, "Global batch in samples (default 8)")
        ->check(CLI::Range(std::int64_t(1), std::int64_t(1) << 40));
    app.add_option("--tp", tp, "Tensor-parallel ranks T")
        ->check(CLI::Range(1, 1 << 16))
        ->capture_default_str();
    app.add_option("--dp", dp, "Data-parallel replicas D")
        ->check(CLI::Range(1, 1 << 20))
        ->capture_default_str();
    app.add_option("--cluster", cluster_name, "Cost-model preset: mpi-local | gpu-cluster")
        ->check(CLI::IsMember(cluster_preset_names()))
        ->capture_default_str();
    app.add_option("--memory-gib", memory_gib,
                   "Memory budget per device in GiB (default: the cluster's; 0: unlimited)")
        ->check(CLI::Range(0.0, 1e9));
    app.add_option("--optimizer", optimizer,
                   "Optimizer state: adam (2 moments) | adam-mixed (float master + 2 float "
                   "moments) | momentum | sgd")
        ->check(CLI::IsMember({"adam", "adam-mixed", "momentum", "sgd"}))
        ->capture_default_str();
    app.add_option("--dtype-bytes", dtype_bytes,
                   "Bytes per element (default 2 on gpu-cluster, 4 on mpi-local)")
        ->check(CLI::IsMember({1, 2, 4, 8}));
    app.add_option("--search", method, "folded | unfolded | flat (for timing; same plan)")
        ->check(CLI::IsMember({"folded", "unfolded", "flat"}))
        ->capture_default_str();
    app.add_option("--fold-depth", fold_depth, "Scope depth of the blocks (0: chosen)")
        ->check(CLI::Range(0, 64))
        ->capture_default_str();
    app.add_option("--disable", disabled,
                   "Strategies the search must not use, comma-separated: a name for every type "
                   "(batch) or Type:name (SoftmaxCrossEntropy:vocab), e.g. for an executor "
                   "without them")
        ->delimiter(',');
    app.add_option("--out", out, "Write the searched plan as JSON to FILE");
    app.add_option("--megatron-out", megatron_out, "Write Megatron-LM's plan as JSON to FILE");
  }

  // Reads the model from the flags into config. @throws CLI::ParseError subclasses.
  void check() {
    if (gpt.empty() && preset.empty() && vit.empty()) {
      throw CLI::RequiredError("--gpt, --preset or --vit");
    }
    if (!vit.empty()) {
      const auto dw = parse_gpt(vit);
      if (!dw || dw->first < 1 || dw->second < 1) {
        throw CLI::ValidationError(
            "--vit", "must be BLOCKSxWIDTH with both >= 1, e.g. 4x64; got '" + vit + "'");
      }
      config.layers = dw->first;
      config.hidden = dw->second;
      config.heads = 4;
      config.seq_len = (28 / patch) * (28 / patch);
      config.vocab = 10; // classes
      config.ffn_hidden = 2 * config.hidden;
      config.batch = 128;
      if (dtype_bytes > 0 && dtype_bytes != 4) {
        throw CLI::ValidationError("--dtype-bytes", "is 4 for --vit (kat_train trains in float)");
      }
      dtype_bytes = 4;
    } else if (!preset.empty()) {
      config = gpt_preset(preset);
    } else {
      const auto lh = parse_gpt(gpt);
      if (!lh || lh->first < 1 || lh->second < 1) {
        throw CLI::ValidationError("--gpt", "must be BLOCKSxHIDDEN with both >= 1, e.g. "
                                            "24x1024; got '" +
                                                gpt + "'");
      }
      config.layers = lh->first;
      config.hidden = lh->second;
      config.seq_len = 1024;
      if (heads == 0 && config.hidden % 64 != 0) {
        throw CLI::ValidationError("--heads", "is needed: hidden " + std::to_string(config.hidden) +
                                                  " is not a multiple of 64");
      }
      config.heads = config.hidden / 64;
    }
    config.heads = heads > 0 ? heads : config.heads;
    config.seq_len = seq > 0 ? seq : config.seq_len;
    config.vocab = vocab > 0 ? vocab : config.vocab;
    config.ffn_hidden = ffn > 0 ? ffn : config.ffn_hidden;
    config.batch = batch > 0 ? batch : config.batch;
    config.dtype_bytes = dtype_bytes > 0 ? dtype_bytes : cluster_name == "mpi-local" ? 4 : 2;
    if (config.hidden % config.heads != 0) {
      throw CLI::ValidationError("--heads", std::to_string(config.heads) +
                                                " does not divide the hidden size " +
                                                std::to_string(config.hidden));
    }
    if (config.batch % dp != 0) {
      throw CLI::ValidationError("--batch", "(the global batch, " + std::to_string(config.batch) +
                                                ") must be divisible by --dp " +
                                                std::to_string(dp));
    }
  }

  // The model's operator graph: a GPT, or kat_train's ViT described by kat::nn (needs Kokkos).
  Graph graph() const {

    if (vit.empty()) {
      return gpt_graph(config);
    }
    kat::nn::models::VitOptions o;
    o.patch = {patch, patch};
    o.depth = static_cast<std::size_t>(config.layers);
    o.width = static_cast<std::size_t>(config.hidden);
    o.heads = static_cast<std::size_t>(config.heads);
    o.mlp_hidden = static_cast<std::size_t>(config.ffn());
    return kat::nn::models::vit<float, Kokkos::HostSpace>(kat::FeatureShape{1, 28, 28}, 10, o)
        .describe(config.batch);
  }

  CostModel cost_model() const {
    CostModel cm;
    cm.cluster = cluster_preset(cluster_name);
    cm.mesh = {dp, tp};
    cm.optimizer = optimizer == "adam"         ? OptimizerMemory::adam()
                   : optimizer == "adam-mixed" ? OptimizerMemory::adam_mixed()
                   : optimizer == "momentum"   ? OptimizerMemory::momentum()
                                               : OptimizerMemory::sgd();
    return cm;
  }

  SearchOptions search_options(const CostModel &cm) const {
    SearchOptions options;
    options.method = search_method_from_string(method);
    options.fold_depth = fold_depth;
    options.memory_budget = memory_gib >= 0 ? memory_gib * gib : cm.cluster.memory_bytes;
    options.disabled = disabled;
    if (!vit.empty()) {
      options.allowed = megatron_executor_allows; // plans kat_train --tensor-parallel runs
    }
    return options;
  }

  // The comparison of the two plans and the searched plan's strategies per block.
  void report(const Graph &g, const CostModel &cm, const SearchOptions &options, const Plan &plan,
              const std::optional<Plan> &megatron, const std::string &megatron_error,
              const Folding &f) const {
    std::printf("kat_plan: %s (%lld heads, %lld positions, vocabulary %lld, MLP %lld), global "
                "batch %lld, %lld-byte elements, %.3f B parameters\n",
                g.name().c_str(), static_cast<long long>(config.heads),
                static_cast<long long>(config.seq_len), static_cast<long long>(config.vocab),
                static_cast<long long>(config.ffn()), static_cast<long long>(config.batch),
                static_cast<long long>(config.dtype_bytes), g.parameter_count() * 1e-9);
    std::printf("mesh: %d data-parallel x %d tensor-parallel = %d ranks; cluster %s: %s\n", dp, tp,
                dp * tp, cm.cluster.name.c_str(), cm.cluster.description.c_str());
    const double state_bytes = cm.optimizer.state_bytes > 0
                                   ? cm.optimizer.state_bytes
                                   : static_cast<double>(config.dtype_bytes);
    char budget[64] = "unlimited";
    if (options.memory_budget > 0) {
      std::snprintf(budget, sizeof budget, "%.1f GiB per device", options.memory_budget / gib);
    }
    std::printf("optimizer %s: %g state(s) of %g bytes per parameter; memory budget %s\n",
                optimizer.c_str(), cm.optimizer.states, state_bytes, budget);
    std::printf("graph: %zu operators; folded at scope depth %d: %zu unique block(s), %zu "
                "instance(s), %zu operators outside blocks\n",
                g.operators().size(), f.depth, f.unique.size(), f.instances.size(),
                f.loose_operators);
    std::printf("search (%s): %.3f ms, %d dynamic program(s)%s\n", plan.search.method.c_str(),
                plan.search.seconds * 1e3, plan.search.passes,
                plan.search.passes > 1 ? " (memory priced to fit the budget)" : "");
    std::printf("\n  %-34s%18s%18s\n", "per device, per step", "searched plan", "Megatron-LM plan");
    const auto value = [&](auto get) -> std::optional<double> {
      return megatron ? std::optional<double>(get(*megatron)) : std::nullopt;
    };
    print_row("step time (ms)", plan.predicted.step_seconds * 1e3,
              value([](const Plan &p) { return p.predicted.step_seconds * 1e3; }), "%18.3f");
    print_row("  compute (ms)", plan.predicted.compute_seconds * 1e3,
              value([](const Plan &p) { return p.predicted.compute_seconds * 1e3; }), "%18.3f");
    print_row("  communication (ms)", plan.predicted.communication_seconds * 1e3,
              value([](const Plan &p) { return p.predicted.communication_seconds * 1e3; }),
              "%18.3f");
    print_row("  of which in the blocks (ms)", block_seconds(plan, f) * 1e3,
              value([&](const Plan &p) { return block_seconds(p, f) * 1e3; }), "%18.3f");
    print_row("communicated (MB)", plan.predicted.bytes_per_device * 1e-6,
              value([](const Plan &p) { return p.predicted.bytes_per_device * 1e-6; }), "%18.1f");
    print_row("memory (GiB)", plan.predicted.memory.total() / gib,
              value([](const Plan &p) { return p.predicted.memory.total() / gib; }), "%18.2f");
    const auto states = [](const Plan &p) {
      return (p.predicted.memory.parameters + p.predicted.memory.gradients +
              p.predicted.memory.optimizer) /
             gib;
    };
    print_row("  parameters, gradients, state", states(plan), value(states), "%18.2f");
    print_row("  activations", plan.predicted.memory.activations / gib,
              value([](const Plan &p) { return p.predicted.memory.activations / gib; }), "%18.2f");
    std::printf("  %-34s%18s%18s\n", "fits the budget", plan.predicted.feasible ? "yes" : "NO",
                megatron ? (megatron->predicted.feasible ? "yes" : "NO") : "-");
    if (!megatron) {
      std::printf("Megatron-LM's plan is not applicable: %s\n", megatron_error.c_str());
    }
    if (!plan.predicted.feasible) {
      std::printf("No plan fits the budget: the searched plan is the one of least memory.\n");
    }
    std::printf("\n");
    for (const auto &u : f.unique) {
      const BlockInstance &b = f.instances[u.instances.front()];
      std::printf("block %s (x%zu):", b.scope.c_str(), u.instances.size());
      for (std::size_t i = b.ops.first; i < b.ops.last; ++i) {
        const OpPlan &o = plan.operators[i];
        std::printf(" %s %s%s", short_name(o.name, b.scope).c_str(), o.strategy.c_str(),
                    i + 1 < b.ops.last ? "," : "\n");
      }
    }
    std::printf("other operators:");
    bool first = true;
    for (std::size_t i = 0; i < plan.operators.size(); ++i) {
      if (f.instance_of_op[i] < 0) {
        std::printf("%s %s %s", first ? "" : ",", plan.operators[i].name.c_str(),
                    plan.operators[i].strategy.c_str());
        first = false;
      }
    }
    std::printf("\n");
  }

  // --out and --megatron-out; the exit code.
  int write(const Plan &plan, const std::optional<Plan> &megatron) const {
    if (!out.empty()) {
      write_plan(plan, out);
      std::printf("wrote %s\n", out.c_str());
    }
    if (!megatron_out.empty()) {
      if (!megatron) {
        std::fprintf(stderr, "kat_plan: --megatron-out: no Megatron-LM plan to write\n");
        return 1;
      }
      write_plan(*megatron, megatron_out);
      std::printf("wrote %s\n", megatron_out.c_str());
    }
    return 0;
  }
};

// `code`, or 1 with the reason on stderr if stdout lost anything written to it (>/dev/full).
int checked_stdout(int code) {
  const std::string error = kat_examples::stdout_error();
  if (error.empty()) {
    return code;
  }
  std::fprintf(stderr, "kat_plan: writing standard output: %s\n", error.c_str());
  return 1;
}

} // namespace

int main(int argc, char **argv) {
  Command c;
  c.add_flags();
  try {
    c.app.parse(argc, argv);
    c.check();
  } catch (const CLI::ParseError &e) {
    return checked_stdout(c.app.exit(e));
  }
  try {
    // The ViT is kat::nn's own model, described layer by layer (its layers need Kokkos).
    std::optional<Kokkos::ScopeGuard> kokkos;
    if (!c.vit.empty()) {
      kokkos.emplace(argc, argv);
    }
    const Graph g = c.graph();
    const CostModel cm = c.cost_model();
    const SearchOptions options = c.search_options(cm);
    const Plan plan = search(g, cm, options);
    std::optional<Plan> megatron;
    std::string megatron_error;
    try {
      megatron = megatron_plan(g, cm, options.memory_budget);
    } catch (const kat::ValueError &e) {
      megatron_error = e.what();
    }
    const Folding f = fold(g, c.fold_depth);
    c.report(g, cm, options, plan, megatron, megatron_error, f);
    return checked_stdout(c.write(plan, megatron));
  } catch (const std::exception &e) {
    std::fprintf(stderr, "kat_plan: %s\n", e.what());
    return 1;
  }
}
