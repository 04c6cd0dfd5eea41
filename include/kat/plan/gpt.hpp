#pragma once
/// @file
/// @brief kat::plan::GptConfig and gpt_graph: the declarative description of GPT-style
/// decoder stacks (Radford et al. 2019; Brown et al. 2020, Table 2.1) as a kat::plan::Graph,
/// and named presets of the sizes docs/benchmarks.md reports.

#include "kat/core/error.hpp"
#include "kat/plan/graph.hpp"

#include <cstdint>
#include <string>
#include <vector>

namespace kat::plan {

/// A GPT-style stack: token and learned position embeddings, `layers` pre-norm blocks
/// (LN → Dense qkv (hidden → 3·hidden) → causal Attention → Dense proj → Add; LN → Dense fc1
/// (hidden → ffn) → GELU → Dense fc2 → Add), a final LN, the LM head (Dense hidden → vocab, no
/// bias; untied from the embedding, since a Graph parameter belongs to one operator) and
/// softmax cross-entropy.
struct GptConfig {
  std::int64_t layers = 12;     ///< blocks, >= 1
  std::int64_t hidden = 768;    ///< model width
  std::int64_t heads = 12;      ///< attention heads; hidden % heads == 0
  std::int64_t seq_len = 1024;  ///< positions per sample
  std::int64_t vocab = 50304;   ///< GPT-2's 50257 padded to a multiple of 128 (Megatron-LM)
  std::int64_t batch = 8;       ///< global batch (samples of seq_len tokens)
  std::int64_t ffn_hidden = 0;  ///< MLP width; 0: 4·hidden
  std::int64_t dtype_bytes = 2; ///< bytes per element (2: 16-bit training, 4: float)

  /// The MLP width: ffn_hidden, or 4·hidden when 0.
  std::int64_t ffn() const { return ffn_hidden > 0 ? ffn_hidden : 4 * hidden; }
  /// Parameters of gpt_graph(*this): V·h + P·h + L·(4h² + 2h·f + 9h + f) + 2h + h·V.
  std::int64_t parameter_count() const {
    const std::int64_t h = hidden, f = ffn(), v = vocab, p = seq_len;
    return v * h + p * h + layers * (4 * h * h + 2 * h * f + 9 * h + f) + 2 * h + h * v;
  }
};

/// @throws ValueError naming the field when one is < 1 (ffn_hidden < 0), hidden is not
///   divisible by heads, or dtype_bytes is not 1, 2, 4 or 8
inline void validate(const GptConfig &c) {
  const char *who = "kat::plan::GptConfig";
  const auto positive = [&](const char *field, std::int64_t v) {
    if (v < 1) {
      throw ValueError(kat::detail::concat(who, ": ", field, " must be >= 1, got ", v));
    }
  };
  positive("layers", c.layers);
  positive("hidden", c.hidden);
  positive("heads", c.heads);
  positive("seq_len", c.seq_len);
  positive("vocab", c.vocab);
  positive("batch", c.batch);
  if (c.ffn_hidden < 0) {
    throw ValueError(
        kat::detail::concat(who, ": ffn_hidden must be >= 0 (0: 4·hidden), got ", c.ffn_hidden));
  }
  if (c.hidden % c.heads != 0) {
    throw ValueError(kat::detail::concat(who, ": hidden (", c.hidden,
                                         ") must be divisible by heads (", c.heads, ")"));
  }
  if (c.dtype_bytes != 1 && c.dtype_bytes != 2 && c.dtype_bytes != 4 && c.dtype_bytes != 8) {
    throw ValueError(
        kat::detail::concat(who, ": dtype_bytes must be 1, 2, 4 or 8, got ", c.dtype_bytes));
  }
}

/// The graph of a GPT-style stack. Operators are named "embed", "pos_embed",
/// "blocks.<i>.{ln1, qkv, attn, proj, add1, ln2, fc1, gelu, fc2, add2}" (scope "blocks.<i>"),
/// "ln_f", "lm_head", "loss". Shapes only: 96 blocks of hidden 12288 build in microseconds.
/// @throws ValueError from validate(c)
inline Graph gpt_graph(const GptConfig &c) {
  validate(c);
  const std::int64_t b = c.batch, p = c.seq_len, h = c.hidden, f = c.ffn(), v = c.vocab;
  const std::int64_t dh = h / c.heads;
  Graph g(c.dtype_bytes, kat::detail::concat("GPT ", c.layers, "x", h));
  const TensorId ids = g.add_input("tokens", {b, p});
  TensorId x =
      g.add("Embedding", "embed", {ids}, {b, p, h}, {{v, h}}, {{"vocab", v}, {"features", h}});
  x = g.add("PositionEmbedding", "pos_embed", {x}, {b, p, h}, {{p, h}},
            {{"positions", p}, {"features", h}});
  const auto dense = [&](const char *name, TensorId in, std::int64_t n_in, std::int64_t n_out,
                         bool bias = true) {
    std::vector<Shape> params{{n_out, n_in}};
    if (bias) {
      params.push_back({n_out});
    }
    return g.add("Dense", name, {in}, {b, p, n_out}, params,
                 {{"in", n_in}, {"out", n_out}, {"bias", bias ? 1 : 0}, {"positions", p}});
  };
  const auto layer_norm = [&](const char *name, TensorId in) {
    return g.add("LayerNorm", name, {in}, {b, p, h}, {{h}, {h}}, {{"features", h}});
  };
  g.push_scope("blocks");
  for (std::int64_t i = 0; i < c.layers; ++i) {
    g.push_scope(std::to_string(i));
    TensorId y = layer_norm("ln1", x);
    y = dense("qkv", y, h, 3 * h);
    y = g.add("Attention", "attn", {y}, {b, p, h}, {},
              {{"heads", c.heads}, {"head_dim", dh}, {"positions", p}, {"causal", 1}});
    y = dense("proj", y, h, h);
    x = g.add("Add", "add1", {x, y}, {b, p, h});
    y = layer_norm("ln2", x);
    y = dense("fc1", y, h, f);
    y = g.add("GELU", "gelu", {y}, {b, p, f});
    y = dense("fc2", y, f, h);
    x = g.add("Add", "add2", {x, y}, {b, p, h});
    g.pop_scope();
  }
  g.pop_scope();
  x = layer_norm("ln_f", x);
  x = dense("lm_head", x, h, v, false);
  OpSpec loss;
  loss.type = "SoftmaxCrossEntropy";
  loss.name = "loss";
  loss.inputs = {x};
  loss.output = {1};
  loss.attributes = {{"classes", v}};
  loss.output_batched = false;
  g.add(loss);
  return g;
}

/// Names of the presets, smallest first.
inline std::vector<std::string> gpt_preset_names() {
  return {"gpt3-350m", "gpt3-1.3b", "gpt2-1.5b", "gpt3-6.7b", "gpt3-175b"};
}

/// A named configuration (batch 8, 16-bit elements; change the fields as needed):
/// - "gpt3-350m": 24 x 1024, 16 heads, 2048 positions (GPT-3 Medium, Brown et al. Table 2.1)
/// - "gpt3-1.3b": 24 x 2048, 16 heads of 128, 2048 positions (GPT-3 XL; the paper's 24 heads
///   of 128 do not multiply to 2048)
/// - "gpt2-1.5b": 48 x 1600, 32 heads of 50, 1024 positions (GPT-2 XL's size; 32 heads instead
///   of its 25 so that 2, 4 and 8 tensor ranks divide them)
/// - "gpt3-6.7b": 32 x 4096, 32 heads, 2048 positions (GPT-3 6.7B)
/// - "gpt3-175b": 96 x 12288, 96 heads, 2048 positions (GPT-3 175B)
/// All with vocabulary 50304 (50257 padded to a multiple of 128, as Megatron-LM pads).
/// @throws ValueError for an unknown name, listing the known ones
inline GptConfig gpt_preset(const std::string &name) {
  GptConfig c;
  c.dtype_bytes = 2;
  c.batch = 8;
  c.vocab = 50304;
  c.seq_len = 2048;
  if (name == "gpt3-350m") {
    c.layers = 24, c.hidden = 1024, c.heads = 16;
  } else if (name == "gpt3-1.3b") {
    c.layers = 24, c.hidden = 2048, c.heads = 16;
  } else if (name == "gpt2-1.5b") {
    c.layers = 48, c.hidden = 1600, c.heads = 32, c.seq_len = 1024;
  } else if (name == "gpt3-6.7b") {
    c.layers = 32, c.hidden = 4096, c.heads = 32;
  } else if (name == "gpt3-175b") {
    c.layers = 96, c.hidden = 12288, c.heads = 96;
  } else {
    std::string known;
    for (const auto &n : gpt_preset_names()) {
      known += (known.empty() ? "" : ", ") + n;
    }
    throw ValueError(
        kat::detail::concat("kat::plan::gpt_preset: unknown preset '", name, "'; known: ", known));
  }
  return c;
}

} // namespace kat::plan
