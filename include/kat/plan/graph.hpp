#pragma once
/// @file
/// @brief kat::plan::Graph: a model as a DAG of operators and shaped tensors, the input of
/// TAP's tensor-parallel plan search (Shi et al., "TAP: Accelerating Large-Scale DNN Training
/// Through Tensor Automatic Parallelisation", arXiv 2302.00247, Sec. 3; docs/tensor_parallel.md).
///
/// Shapes only: no tensor is allocated, so a 96-block GPT of hidden size 12288 builds in
/// microseconds. Host-only C++17, no Kokkos.

#include "kat/core/error.hpp"

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <map>
#include <string>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

namespace kat::plan {

/// A tensor's extents, outermost first; activations have the (global) batch first: a Dense
/// input is [B, P, in] for B samples of P positions.
using Shape = std::vector<std::int64_t>;

/// Index of a tensor in Graph::tensors().
using TensorId = std::int32_t;

/// Product of the extents (1 for an empty shape).
inline std::int64_t numel(const Shape &shape) {
  std::int64_t n = 1;
  for (const auto e : shape) {
    n *= e;
  }
  return n;
}

/// "[8, 1024, 3072]".
inline std::string shape_string(const Shape &shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) {
    s += (i ? ", " : "") + std::to_string(shape[i]);
  }
  return s + "]";
}

/// An operator attribute: an integer, a real number or a string.
class Attribute {
public:
  /// What the attribute holds.
  enum class Kind { integer, real, text };

  Attribute() = default;
  /// Any integral type (bool gives 0 or 1).
  template <class T, std::enable_if_t<std::is_integral_v<T>, int> = 0>
  Attribute(T value) : integer_(static_cast<std::int64_t>(value)) {} // NOLINT: implicit on purpose
  /// Any floating-point type.
  template <class T, std::enable_if_t<std::is_floating_point_v<T>, int> = 0>
  Attribute(T value) : kind_(Kind::real), real_(static_cast<double>(value)) {} // NOLINT
  /// A string.
  Attribute(const char *value) : kind_(Kind::text), text_(value) {} // NOLINT
  /// A string.
  Attribute(std::string value) : kind_(Kind::text), text_(std::move(value)) {} // NOLINT

  /// Which of integer, real or text the attribute holds.
  Kind kind() const { return kind_; }
  /// The integer. @throws ValueError if the attribute is not an integer.
  std::int64_t integer() const {
    if (kind_ != Kind::integer) {
      throw ValueError(
          kat::detail::concat("kat::plan::Attribute: integer requested from ", to_string()));
    }
    return integer_;
  }
  /// The number (an integer converts). @throws ValueError for a string.
  double real() const {
    if (kind_ == Kind::text) {
      throw ValueError(
          kat::detail::concat("kat::plan::Attribute: number requested from ", to_string()));
    }
    return kind_ == Kind::integer ? static_cast<double>(integer_) : real_;
  }
  /// The string. @throws ValueError if the attribute is not a string.
  const std::string &text() const {
    if (kind_ != Kind::text) {
      throw ValueError(
          kat::detail::concat("kat::plan::Attribute: string requested from ", to_string()));
    }
    return text_;
  }
  /// Unambiguous text: i:42, r:0.10000000000000001, s:"gelu" (what canonical hashing uses).
  std::string to_string() const {
    if (kind_ == Kind::integer) {
      return "i:" + std::to_string(integer_);
    }
    if (kind_ == Kind::real) {
      char buffer[40];
      std::snprintf(buffer, sizeof buffer, "r:%.17g", real_);
      return buffer;
    }
    return "s:\"" + text_ + "\"";
  }
  friend bool operator==(const Attribute &a, const Attribute &b) {
    return a.kind_ == b.kind_ && a.integer_ == b.integer_ && a.real_ == b.real_ &&
           a.text_ == b.text_;
  }
  friend bool operator!=(const Attribute &a, const Attribute &b) { return !(a == b); }

private:
  Kind kind_ = Kind::integer;
  std::int64_t integer_ = 0;
  double real_ = 0;
  std::string text_;
};

/// Attributes by name, ordered (so their canonical text does not depend on insertion order).
using Attributes = std::map<std::string, Attribute>;

/// A tensor: an activation (produced by an operator, or a graph input such as token ids) or
/// a parameter (owned by one operator).
struct Tensor {
  TensorId id = -1;       ///< its index in Graph::tensors()
  Shape shape;            ///< its extents; batch first when batched
  bool parameter = false; ///< a weight or bias, used by operator `owner` only
  bool batched = true;    ///< the first extent is the global batch (false for parameters and
                          ///< reduced outputs such as a mean loss)
  int producer = -1;      ///< index of the operator computing it; -1 for graph inputs and
                          ///< parameters
  int owner = -1;         ///< for a parameter: the operator that uses it
  std::string name;       ///< a name for messages and plans
};

/// One operator. Its output is one activation tensor; its parameters are its own.
struct Operator {
  std::string name;      ///< unique in the graph, e.g. "blocks.3.qkv" or the layer path "3.body.1"
  std::string type;      ///< "Dense", "Attention", ... (docs/tensor_parallel.md lists them)
  std::string scope;     ///< dotted scope path, e.g. "blocks.3" ("" at the top)
  Attributes attributes; ///< its attributes (e.g. "in", "out" of a Dense)
  std::vector<TensorId> inputs;     ///< activations read, in order
  std::vector<TensorId> parameters; ///< weight first, then bias
  TensorId output = -1;             ///< the activation it computes

  /// Whether the attribute `key` is set.
  bool has(const std::string &key) const { return attributes.count(key) != 0; }
  /// The integer attribute `key`. @throws ValueError naming the operator when it is missing or
  /// not an integer.
  std::int64_t integer(const std::string &key) const {
    const auto it = attributes.find(key);
    if (it == attributes.end() || it->second.kind() != Attribute::Kind::integer) {
      throw ValueError(kat::detail::concat("kat::plan: ", type, " '", name,
                                           "' needs the integer attribute '", key, "'"));
    }
    return it->second.integer();
  }
  /// The integer attribute `key`, or `fallback` when absent.
  std::int64_t integer_or(const std::string &key, std::int64_t fallback) const {
    return has(key) ? integer(key) : fallback;
  }
};

/// What Graph::add needs to append an operator.
struct OpSpec {
  std::string type; ///< the operator type ("Dense", ...; see Graph)
  std::string name; ///< local name; the operator's name is "<scope>.<name>" ("" : generated)
  std::vector<TensorId> inputs;  ///< the activations it reads, in order
  Shape output;                  ///< output shape, batch first
  std::vector<Shape> parameters; ///< parameter shapes, weight first
  Attributes attributes;         ///< its attributes
  bool output_batched = true;    ///< false when the output has no batch extent (a mean loss)
};

/// A model as operators over shaped tensors, built in execution order (an operator's inputs
/// exist before it), so the operator order is a topological order.
///
/// Operator types with checked attributes and shapes (others are accepted and treated as
/// "replicated or batch-split, following the input"):
/// - "Dense" {in, out, bias (0/1), positions}: input [B, P, in] -> [B, P, out], weight
///   [out, in], bias [out].
/// - "Attention" {heads, head_dim, positions, causal}: [B, P, 3·heads·head_dim] (Q|K|V on the
///   feature axis, heads inside each) -> [B, P, heads·head_dim]; no parameters.
/// - "LayerNorm" {features}: shape-preserving, parameters [features] (gain, bias).
/// - "GELU", "ReLU": element-wise. "Add": two inputs of the output's shape (residual).
/// - "Embedding" {vocab, features}: ids [B, P] (or [B, P, 1]) -> [B, P, features], table
///   [vocab, features].
/// - "PositionEmbedding" {positions, features}: y = x + E, E [positions, features].
/// - "Conv2d", "Pool", "Flatten", "SoftmaxCrossEntropy" (logits [.., V] -> loss).
class Graph {
public:
  /// @param dtype_bytes bytes per element of activations, parameters and gradients (4: float)
  /// @param name        the graph's name, for messages and plans
  /// @throws ValueError if dtype_bytes < 1
  explicit Graph(std::int64_t dtype_bytes = 4, std::string name = "")
      : dtype_bytes_(dtype_bytes), name_(std::move(name)) {
    if (dtype_bytes < 1) {
      throw ValueError(
          kat::detail::concat("kat::plan::Graph: dtype_bytes must be >= 1, got ", dtype_bytes));
    }
  }

  /// The graph's name ("" unless given).
  const std::string &name() const { return name_; }
  /// Bytes per element of activations, parameters and gradients.
  std::int64_t dtype_bytes() const { return dtype_bytes_; }

  /// Adds a graph input (data, token ids): it has no producer and needs no gradient.
  /// @throws ShapeError for an empty shape or a non-positive extent
  TensorId add_input(const std::string &name, const Shape &shape, bool batched = true) {
    check_shape("kat::plan::Graph::add_input", name, "shape", shape);
    return new_tensor(shape, false, batched, -1, name);
  }

  /// Enters scope `part` (no dots): later operators get scope "<outer>.<part>".
  /// @throws ValueError for an empty part or one with a '.'
  void push_scope(const std::string &part) {
    if (part.empty() || part.find('.') != std::string::npos) {
      throw ValueError(kat::detail::concat(
          "kat::plan::Graph::push_scope: part must be non-empty without '.', got '", part, "'"));
    }
    scopes_.push_back(part);
  }
  /// Leaves the innermost scope. @throws ValueError at the top level
  void pop_scope() {
    if (scopes_.empty()) {
      throw ValueError("kat::plan::Graph::pop_scope: no scope is open");
    }
    scopes_.pop_back();
  }
  /// The current scope path ("" at the top).
  std::string scope() const {
    std::string s;
    for (const auto &p : scopes_) {
      s += (s.empty() ? "" : ".") + p;
    }
    return s;
  }

  /// Appends an operator in the current scope and returns its output tensor.
  /// @throws ValueError for an unknown input id, a parameter used as an input, a duplicate
  ///   name, a missing attribute; ShapeError for shapes that contradict the attributes
  ///   (Dense: input [.., in], output [.., out], weight [out, in], bias [out]; see the class)
  TensorId add(OpSpec spec) {
    const std::string where = "kat::plan::Graph::add";
    Operator op;
    op.type = std::move(spec.type);
    if (op.type.empty()) {
      throw ValueError(where + ": the operator type is empty");
    }
    op.scope = scope();
    const std::string local =
        spec.name.empty() ? op.type + std::to_string(operators_.size()) : spec.name;
    op.name = op.scope.empty() ? local : op.scope + "." + local;
    if (index_.count(op.name)) {
      throw ValueError(kat::detail::concat(where, ": an operator named '", op.name,
                                           "' exists already (names must be unique)"));
    }
    op.attributes = std::move(spec.attributes);
    for (const auto id : spec.inputs) {
      if (id < 0 || static_cast<std::size_t>(id) >= tensors_.size()) {
        throw ValueError(kat::detail::concat(where, ": ", op.type, " '", op.name,
                                             "': input tensor id ", id, " does not exist (",
                                             tensors_.size(), " tensors)"));
      }
      if (tensors_[static_cast<std::size_t>(id)].parameter) {
        throw ValueError(kat::detail::concat(where, ": ", op.type, " '", op.name,
                                             "': input tensor ", id,
                                             " is a parameter; pass parameter shapes instead"));
      }
    }
    op.inputs = std::move(spec.inputs);
    check_shape(where, op.name, "output shape", spec.output);
    for (const auto &p : spec.parameters) {
      check_shape(where, op.name, "parameter shape", p);
    }
    check_operator(op, spec.output, spec.parameters);
    const int index = static_cast<int>(operators_.size());
    for (std::size_t k = 0; k < spec.parameters.size(); ++k) {
      const TensorId p = new_tensor(spec.parameters[k], true, false, -1,
                                    op.name + (k == 0   ? ".weight"
                                               : k == 1 ? ".bias"
                                                        : ".p" + std::to_string(k)));
      tensors_[static_cast<std::size_t>(p)].owner = index;
      op.parameters.push_back(p);
    }
    op.output = new_tensor(spec.output, false, spec.output_batched, index, op.name);
    index_.emplace(op.name, operators_.size());
    operators_.push_back(std::move(op));
    return operators_.back().output;
  }

  /// Shorthand for add(OpSpec{...}).
  TensorId add(std::string type, std::string name, std::vector<TensorId> inputs, Shape output,
               std::vector<Shape> parameters = {}, Attributes attributes = {}) {
    OpSpec spec;
    spec.type = std::move(type);
    spec.name = std::move(name);
    spec.inputs = std::move(inputs);
    spec.output = std::move(output);
    spec.parameters = std::move(parameters);
    spec.attributes = std::move(attributes);
    return add(std::move(spec));
  }

  /// The operators, in execution (topological) order.
  const std::vector<Operator> &operators() const { return operators_; }
  /// The tensors, indexed by TensorId.
  const std::vector<Tensor> &tensors() const { return tensors_; }
  /// Operator i. @throws std::out_of_range for i >= operators().size()
  const Operator &op(std::size_t i) const { return operators_.at(i); }
  /// @throws ValueError for an id outside [0, tensors().size())
  const Tensor &tensor(TensorId id) const {
    if (id < 0 || static_cast<std::size_t>(id) >= tensors_.size()) {
      throw ValueError(kat::detail::concat("kat::plan::Graph::tensor: id must be in [0, ",
                                           tensors_.size(), "), got ", id));
    }
    return tensors_[static_cast<std::size_t>(id)];
  }
  /// Index of the operator named `name`. @throws ValueError if there is none
  std::size_t find(const std::string &name) const {
    const auto it = index_.find(name);
    if (it == index_.end()) {
      throw ValueError(
          kat::detail::concat("kat::plan::Graph::find: no operator named '", name, "'"));
    }
    return it->second;
  }
  /// Whether an operator is named `name`.
  bool contains(const std::string &name) const { return index_.count(name) != 0; }

  /// For every tensor, the operators reading it (in order; an operator reading it twice
  /// appears twice).
  std::vector<std::vector<std::size_t>> consumers() const {
    std::vector<std::vector<std::size_t>> c(tensors_.size());
    for (std::size_t i = 0; i < operators_.size(); ++i) {
      for (const auto t : operators_[i].inputs) {
        c[static_cast<std::size_t>(t)].push_back(i);
      }
    }
    return c;
  }

  /// Parameters of all operators (elements).
  std::int64_t parameter_count() const {
    std::int64_t n = 0;
    for (const auto &t : tensors_) {
      n += t.parameter ? numel(t.shape) : 0;
    }
    return n;
  }

private:
  static void check_shape(const std::string &where, const std::string &name, const char *what,
                          const Shape &shape) {
    bool ok = !shape.empty();
    for (const auto e : shape) {
      ok = ok && e > 0;
    }
    if (!ok) {
      throw ShapeError(kat::detail::concat(where, ": '", name, "': ", what,
                                           " must be non-empty with positive extents, got ",
                                           shape_string(shape)));
    }
  }

  TensorId new_tensor(const Shape &shape, bool parameter, bool batched, int producer,
                      std::string name) {
    Tensor t;
    t.id = static_cast<TensorId>(tensors_.size());
    t.shape = shape;
    t.parameter = parameter;
    t.batched = batched;
    t.producer = producer;
    t.name = std::move(name);
    tensors_.push_back(std::move(t));
    return tensors_.back().id;
  }

  const Shape &input_shape(const Operator &op, std::size_t k) const {
    return tensors_[static_cast<std::size_t>(op.inputs[k])].shape;
  }

  void require_inputs(const Operator &op, std::size_t n) const {
    if (op.inputs.size() != n) {
      throw ValueError(kat::detail::concat("kat::plan::Graph::add: ", op.type, " '", op.name,
                                           "' takes ", n, " input(s), got ", op.inputs.size()));
    }
  }
  void require_params(const Operator &op, const std::vector<Shape> &params,
                      const std::vector<Shape> &expected) const {
    const std::string who = "kat::plan::Graph::add: " + op.type + " '" + op.name + "'";
    if (params.size() != expected.size()) {
      throw ShapeError(kat::detail::concat(who, ": takes ", expected.size(), " parameter(s), got ",
                                           params.size()));
    }
    for (std::size_t k = 0; k < params.size(); ++k) {
      if (params[k] != expected[k]) {
        throw ShapeError(kat::detail::concat(who, ": parameter ", k, " must be ",
                                             shape_string(expected[k]), ", got ",
                                             shape_string(params[k])));
      }
    }
  }
  static void require_shape(const Operator &op, const char *what, const Shape &expected,
                            const Shape &actual) {
    if (expected != actual) {
      throw ShapeError(kat::detail::concat("kat::plan::Graph::add: ", op.type, " '", op.name,
                                           "': ", what, " must be ", shape_string(expected),
                                           ", got ", shape_string(actual)));
    }
  }
  static Shape with_last(Shape s, std::int64_t last) {
    s.back() = last;
    return s;
  }
  static std::int64_t positive(const Operator &op, const char *key) {
    const auto v = op.integer(key);
    if (v < 1) {
      throw ValueError(kat::detail::concat("kat::plan::Graph::add: ", op.type, " '", op.name,
                                           "': attribute '", key, "' must be >= 1, got ", v));
    }
    return v;
  }

  // Checks the operator types whose attributes the cost model reads.
  void check_operator(const Operator &op, const Shape &out,
                      const std::vector<Shape> &params) const {
    const auto &type = op.type;
    if (type == "Dense") {
      require_inputs(op, 1);
      const auto in = positive(op, "in"), o = positive(op, "out");
      const bool bias = op.integer_or("bias", 1) != 0;
      const Shape &x = input_shape(op, 0);
      if (x.back() != in) {
        throw ShapeError(kat::detail::concat(
            "kat::plan::Graph::add: Dense '", op.name, "': input feature extent must be ", in,
            " (attribute in), got ", x.back(), " in input ", shape_string(x)));
      }
      require_shape(op, "output shape", with_last(x, o), out);
      std::vector<Shape> expected{{o, in}};
      if (bias) {
        expected.push_back({o});
      }
      require_params(op, params, expected);
    } else if (type == "Attention") {
      require_inputs(op, 1);
      const auto heads = positive(op, "heads"), dh = positive(op, "head_dim");
      const Shape &x = input_shape(op, 0);
      if (x.size() < 2 || x.back() != 3 * heads * dh) {
        throw ShapeError(kat::detail::concat("kat::plan::Graph::add: Attention '", op.name,
                                             "': input must be [.., 3·heads·head_dim = ",
                                             3 * heads * dh, "] (Q|K|V), got ", shape_string(x)));
      }
      require_shape(op, "output shape", with_last(x, heads * dh), out);
      require_params(op, params, {});
    } else if (type == "LayerNorm") {
      require_inputs(op, 1);
      const auto f = positive(op, "features");
      require_shape(op, "input feature extent", {f}, {input_shape(op, 0).back()});
      require_shape(op, "output shape", input_shape(op, 0), out);
      if (!params.empty()) {
        require_params(op, params, {{f}, {f}});
      }
    } else if (type == "GELU" || type == "ReLU") {
      require_inputs(op, 1);
      require_shape(op, "output shape", input_shape(op, 0), out);
      require_params(op, params, {});
    } else if (type == "Add") {
      require_inputs(op, 2);
      require_shape(op, "second input shape", input_shape(op, 0), input_shape(op, 1));
      require_shape(op, "output shape", input_shape(op, 0), out);
      require_params(op, params, {});
    } else if (type == "Embedding") {
      require_inputs(op, 1);
      const auto v = positive(op, "vocab"), f = positive(op, "features");
      require_shape(op, "output feature extent", {f}, {out.back()});
      require_params(op, params, {{v, f}});
    } else if (type == "PositionEmbedding") {
      require_inputs(op, 1);
      const auto p = positive(op, "positions"), f = positive(op, "features");
      const Shape &x = input_shape(op, 0);
      if (x.size() < 3 || x.back() != f || x[x.size() - 2] != p) {
        throw ShapeError(kat::detail::concat("kat::plan::Graph::add: PositionEmbedding '", op.name,
                                             "': input must be [B, ", p, ", ", f, "], got ",
                                             shape_string(x)));
      }
      require_shape(op, "output shape", x, out);
      require_params(op, params, {{p, f}});
    }
  }

  std::int64_t dtype_bytes_;
  std::string name_;
  std::vector<std::string> scopes_;
  std::vector<Operator> operators_;
  std::vector<Tensor> tensors_;
  std::unordered_map<std::string, std::size_t> index_;
};

} // namespace kat::plan
