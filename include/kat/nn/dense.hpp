#pragma once
/// @file
/// @brief Fully connected layer y = x Wᵀ + b.

#include "kat/core/blas.hpp"
#include "kat/core/csr_weight.hpp"
#include "kat/core/error.hpp"
#include "kat/core/mixed_gemm.hpp"
#include "kat/core/policy.hpp"
#include "kat/core/profiling.hpp"
#include "kat/core/views.hpp"
#include "kat/core/workspace.hpp"
#include "kat/nn/detail/dense_kernels.hpp"
#include "kat/nn/detail/row_vectors.hpp"
#include "kat/nn/detail/sparse_products.hpp"
#include "kat/nn/init.hpp"
#include "kat/nn/layer.hpp"

#include <Kokkos_Core.hpp>

#include <cmath>
#include <cstdint>
#include <memory>
#include <string>

namespace kat::nn {

using kat::sparse::SparsePath;

namespace detail {

/// a(i, j) = x(i, j) for the x.extent(1) columns of x and 1 in any further column of a:
/// a = [x 1] when a has one column more than x. a: rows x (>= x columns), same rows as x.
template <class ExecSpace, class XView, class AView>
void copy_with_ones_column(const ExecSpace &space, const XView &x, const AView &a) {
  const std::size_t in = x.extent(1);
  Kokkos::parallel_for("kat::nn::Dense::record_a", matrix_policy(space, a.extent(0), a.extent(1)),
                       CopyWithOnesColumn<XView, AView>{a, in, x});
}

/// The weight gradient of a masked layer on the dense path: dW = mask ⊙ g (`accumulate` false)
/// or dW += mask ⊙ g (`accumulate` true), where g = dyᵀ x is already in `g`. g and dW are
/// contiguous column-major out x in matrices, indexed flat like the mask; g may be dW itself
/// when overwriting; accumulating adds 0 at the inactive entries, which keeps their values.
/// g is loaded unconditionally so that the compiler selects instead of branching: with the
/// load inside the condition, a random half-dense 256 x 784 mask took 770-940 µs on the host
/// (branch mispredictions) instead of 33-37 µs.
template <class ExecSpace, class Mask, class G, class DW>
void apply_weight_mask(const ExecSpace &space, const Mask &mask, const G &g, const DW &dw,
                       bool accumulate) {
  using value = typename DW::non_const_value_type;
  const std::uint8_t *m = mask.data();
  const value *gp = g.data();
  value *dp = dw.data();
  const Kokkos::RangePolicy<ExecSpace> policy(space, 0, mask.extent(0));
  if (accumulate) {
    Kokkos::parallel_for("kat::nn::Dense::mask_weight_gradient", policy,
                         MaskedGradientAdd<value>{gp, dp, m});
  } else {
    Kokkos::parallel_for("kat::nn::Dense::mask_weight_gradient", policy,
                         MaskedGradientAssign<value>{gp, dp, m});
  }
}

/// Number of nonzero entries of a 0/1 mask.
template <class ExecSpace, class Mask>
std::size_t count_active(const ExecSpace &space, const Mask &m) {
  std::size_t count = 0;
  Kokkos::parallel_reduce("kat::nn::Dense::count_active",
                          Kokkos::RangePolicy<ExecSpace>(space, 0, m.extent(0)),
                          CountActive<Mask>{m}, count);
  return count;
}

} // namespace detail

/// What a Dense layer multiplies: the whole sample, or each position of it.
enum class DenseInput {
  /// The sample's features, flattened: input shape of size `in`, output `{out}`.
  flattened,
  /// Each position (token) on its own, as PyTorch's nn.Linear over the last dimension and the
  /// position-wise layers of a transformer (Vaswani et al. 2017, sec. 3.3): input `{in, H, W}`,
  /// output `{out, H, W}`; the N x in·P batch is the (N·P) x in matrix of its rows
  /// (kat::FeatureShape's index order), so each product is still one GEMM.
  per_position
};

/// Fully connected (Linear) layer: y = x Wᵀ + b, x: N x in, W: out x in, b: out, y: N x out.
///
/// With DenseInput::per_position the same applies to each of the P = H·W positions of an
/// `{in, H, W}` input: the N x in·P batch matrix is read as the (N·P) x in matrix whose row
/// n + N·p is position p of sample n (the memory order of kat::FeatureShape), so forward and
/// backward are each one GEMM over N·P rows. K-FAC then sees a = [x 1] with N·P rows and
/// samples = N, as for a convolution (Grosse & Martens 2016).
///
/// W and b are stored back to back in the flat parameter buffer, W column-major, so [W b] is
/// one out x (in+1) column-major matrix — the gradient matrix K-FAC preconditions
/// (Martens & Grosse 2015, sec. 3, with the bias as an extra input column of ones).
///
/// Initialization follows torch.nn.Linear: W ~ U(-1/sqrt(in), 1/sqrt(in)) (Kaiming uniform
/// with a = sqrt(5)), b ~ U(-1/sqrt(in), 1/sqrt(in)).
///
/// With record_curvature(true), forward stores a = [x 1] (N x (in+1)) and backward keeps
/// g = dL/dy (N x out) as given, i.e. including the 1/N of a batch-mean loss.
///
/// **Sparse weights** (sparse training: SET, Mocanu et al. 2018; RigL, Evci et al. 2020).
/// set_weight_mask() records which entries of W are active. The layer then treats the
/// inactive weights as 0: the caller keeps them exactly 0 in the flat buffer (the mask
/// component does), and backward writes a masked weight gradient. Below a crossover density
/// the products run on the active weights only (kat::sparse::CsrWeight, O(N nnz) each)
/// instead of dense GEMMs (O(N out in)); which path runs changes the time, not the result
/// (beyond rounding). See docs/sparse.md.
///
/// **bf16** (set_precision(Precision::bf16); docs/precision.md): the three products take bf16
/// operands and accumulate in fp32 (kat::MixedPrecisionGemm). forward rounds x and W once
/// (kat::Bf16Operand) and backward rounds dy once; dW = dyᵀx and dx = dy W reuse them, so x
/// and W must hold forward's values until backward (as they must for the fp32 gradient). With
/// a bias, forward rounds [x 1] and [W b], so the product adds b rounded to bf16 (as PyTorch's
/// autocast rounds linear's bias), and backward forms [dW db] = dyᵀ[x 1] in one product (db:
/// the fp32 sum of the rounded dy, as in a bf16 convolution; a masked layer sums the
/// unrounded dy). The K-FAC recording path and the sparse path round per product.
template <class Scalar = float, class MemorySpace = DefaultMemorySpace>
class Dense final : public Layer<Scalar, MemorySpace> {
  using base = Layer<Scalar, MemorySpace>;

public:
  using typename base::execution_space;
  using typename base::matrix_type;

  /// @param in_features   inputs per sample (per position with DenseInput::per_position), > 0
  /// @param out_features  outputs, > 0
  /// @param bias          whether the layer has a bias b
  /// @param input         DenseInput::flattened (the whole sample) or DenseInput::per_position
  /// @throws ValueError if either size is 0.
  Dense(std::size_t in_features, std::size_t out_features, bool bias = true,
        DenseInput input = DenseInput::flattened)
      : in_(in_features), out_(out_features), bias_(bias), input_(input), a_("kat::nn::Dense::a"),
        grad_scratch_("kat::nn::Dense::masked_gradient") {
    if (in_ == 0 || out_ == 0) {
      throw ValueError(kat::detail::concat("kat::nn::Dense: in_features and out_features must be "
                                           "> 0, got in_features = ",
                                           in_, ", out_features = ", out_));
    }
  }

  std::string name() const override { return "Dense"; }
  /// The input features per sample (per position with DenseInput::per_position).
  std::size_t in_features() const { return in_; }
  /// The output features.
  std::size_t out_features() const { return out_; }
  /// Whether the layer has a bias.
  bool has_bias() const { return bias_; }
  /// Whether the layer maps the whole sample or each position.
  DenseInput input_kind() const { return input_; }
  /// Whether input_kind() is DenseInput::per_position.
  bool per_position() const { return input_ == DenseInput::per_position; }

  /// flattened: `{out}` for an input of size in_features; per_position: `{out, H, W}` for an
  /// input `{in_features, H, W}`.
  /// @throws ShapeError otherwise.
  FeatureShape output_shape(const FeatureShape &input) const override {
    if (per_position()) {
      kat::detail::require_extent("kat::nn::Dense (per position)", "input channels", in_,
                                  static_cast<std::size_t>(input.channels));
      return FeatureShape{static_cast<int>(out_), input.height, input.width};
    }
    kat::detail::require_extent("kat::nn::Dense", "input features", in_, input.size());
    return FeatureShape{static_cast<int>(out_)};
  }

  std::size_t parameter_count() const override { return out_ * (in_ + (bias_ ? 1 : 0)); }

  /// "weight" (out x in) then, with a bias, "bias" (out), as [W b] column-major.
  std::vector<ParameterSpec> parameter_specs() const override {
    std::vector<ParameterSpec> specs{{"weight", ParameterRole::weight, {out_, in_}, 0}};
    if (bias_) {
      specs.push_back({"bias", ParameterRole::bias, {out_}, out_ * in_});
    }
    return specs;
  }

  /// Binds W (out x in, column-major) followed by b (out), so that [W b] is one out x (in+1)
  /// column-major matrix, K-FAC's gradient.
  void bind(Scalar *params, Scalar *grads) override {
    const std::size_t cols = in_ + (bias_ ? 1 : 0);
    weight_bias_ = matrix_type(params, out_, cols);
    grad_weight_bias_ = matrix_type(grads, out_, cols);
    weight_ = matrix_type(params, out_, in_);
    grad_weight_ = matrix_type(grads, out_, in_);
    if (bias_) {
      bias_view_ = Vector<Scalar, MemorySpace>(params + out_ * in_, out_);
      grad_bias_ = Vector<Scalar, MemorySpace>(grads + out_ * in_, out_);
    }
  }

  void reset_parameters(const execution_space &space, std::uint64_t seed) override {
    Vector<Scalar, MemorySpace> w(weight_.data(), out_ * in_);
    kaiming_uniform_(space, w, in_, std::sqrt(5.0), seed, 0);
    if (bias_) {
      const double bound = 1.0 / std::sqrt(static_cast<double>(in_));
      uniform_(space, bias_view_, -bound, bound, seed, 1);
    }
  }

  /// W (out x in), a view of the flat parameter buffer.
  const matrix_type &weight() const { return weight_; }
  /// b (out), empty without bias.
  const Vector<Scalar, MemorySpace> &bias() const { return bias_view_; }
  /// dW, out x in, a view into the flat gradient buffer.
  const matrix_type &weight_gradient() const { return grad_weight_; }
  /// db (out); empty without a bias.
  const Vector<Scalar, MemorySpace> &bias_gradient() const { return grad_bias_; }

  /// @name Sparse weights
  /// @{

  /// Records a snapshot of `active` (entry r + out * c says whether W(r, c) is active, any
  /// nonzero byte meaning active) and chooses the execution path: `path` sparse or dense as
  /// asked, automatic sparse exactly when the mask's density (active / (out * in)) is below
  /// sparse_crossover(). With the sparse path it builds the CSR structure of W on the device
  /// (O(out * in) work, one host read-back); the structure of Wᵀ follows on the first
  /// backward. Call it again whenever the mask changes (a RigL/SET update): the layer
  /// never reads `active` after this call.
  ///
  /// From then on, with either path: forward uses W as stored (inactive weights must be 0 in
  /// the flat buffer: the sparse path skips them, the dense path multiplies them); backward
  /// writes dW = mask ⊙ dyᵀx, or adds it in accumulate mode (inactive entries of the gradient
  /// are left as they were), unless request_dense_weight_gradient() asked for the full dyᵀx.
  /// The bias, dx and the curvature record are as without a mask.
  ///
  /// @param space   runs the copy, the count and the structure kernels
  /// @param active  out * in flags, column-major like W
  /// @param path    SparsePath::automatic (by density), sparse or dense
  /// @throws ShapeError if active.extent(0) != out * in.
  void set_weight_mask(const execution_space &space,
                       const Kokkos::View<const std::uint8_t *, MemorySpace> &active,
                       SparsePath path = SparsePath::automatic) {
    kat::detail::require_extent("kat::nn::Dense::set_weight_mask", "active extent", out_ * in_,
                                active.extent(0));
    ScopedRegion region("kat::nn::Dense::set_weight_mask");
    if (mask_.extent(0) != active.extent(0)) {
      mask_ = Kokkos::View<std::uint8_t *, MemorySpace>(
          Kokkos::view_alloc(Kokkos::WithoutInitializing, "kat::nn::Dense::mask"),
          active.extent(0));
    }
    Kokkos::deep_copy(space, mask_, active);
    active_ = detail::count_active(space, mask_);
    has_mask_ = true;
    path_ = path;
    // Created here, not in forward(): see detail::SparseProducts.
    sparse_ = std::make_unique<detail::CsrProducts<Scalar, MemorySpace>>(out_, in_);
    if (uses_sparse_path()) {
      sparse_->build(space, mask_);
    }
  }

  /// set_weight_mask(space, active, path) on the default execution space instance.
  void set_weight_mask(const Kokkos::View<const std::uint8_t *, MemorySpace> &active,
                       SparsePath path = SparsePath::automatic) {
    set_weight_mask(execution_space(), active, path);
  }

  /// Back to a dense layer: no mask, dense products, full weight gradients.
  void clear_weight_mask() {
    has_mask_ = false;
    active_ = 0;
    path_ = SparsePath::automatic;
    mask_ = Kokkos::View<std::uint8_t *, MemorySpace>();
    sparse_.reset();
  }

  /// Whether a weight mask is set.
  bool has_weight_mask() const { return has_mask_; }
  /// The path asked for in set_weight_mask() (automatic without a mask).
  SparsePath sparse_path() const { return path_; }
  /// Number of active weights: out * in without a mask.
  std::size_t active_weights() const { return has_mask_ ? active_ : out_ * in_; }
  /// active_weights() / (out * in): 1 without a mask.
  double weight_density() const { return double(active_weights()) / (double(out_) * double(in_)); }

  /// Whether forward and backward run the sparse products: a mask is set and its path is
  /// sparse, or automatic with weight_density() < sparse_crossover().
  bool uses_sparse_path() const {
    if (!has_mask_) {
      return false;
    }
    switch (path_) {
    case SparsePath::sparse:
      return true;
    case SparsePath::dense:
      return false;
    case SparsePath::automatic:
    default:
      return weight_density() < crossover_;
    }
  }

  /// Density below which SparsePath::automatic runs the sparse products; defaults to
  /// kat::sparse::default_sparse_crossover, measured on the development machine
  /// (docs/benchmarks.md). Takes effect at once (the structure is built on the next forward).
  /// @throws ValueError unless 0 <= crossover <= 1.
  void set_sparse_crossover(double crossover) {
    if (!(crossover >= 0.0 && crossover <= 1.0)) {
      throw ValueError(kat::detail::concat(
          "kat::nn::Dense::set_sparse_crossover: crossover must be in [0, 1], got ", crossover));
    }
    crossover_ = crossover;
  }
  /// The density below which set_weight_mask() chooses the sparse path automatically.
  double sparse_crossover() const { return crossover_; }

  /// The next backward() computes the full dense weight gradient dyᵀx (or adds it, in
  /// accumulate mode) instead of the masked one, whatever the path: RigL's growth step ranks
  /// inactive weights by it. Applies to one backward(), which resets it.
  void request_dense_weight_gradient() { dense_gradient_requested_ = true; }
  /// Whether the next backward() computes the dense weight gradient.
  bool dense_weight_gradient_requested() const { return dense_gradient_requested_; }

  /// Whether the CSR structure of the current mask exists: built by set_weight_mask() or the
  /// first forward() or backward() on the sparse path, dropped by the next mask change.
  bool sparse_structure_built() const { return sparse_ && sparse_->built(); }

  /// @}

  void forward(const execution_space &space, const matrix_type &x_in,
               const matrix_type &y_in) override {
    ScopedRegion region("kat::nn::Dense::forward");
    samples_ = x_in.extent(0);
    const matrix_type x = rows(x_in, in_, "forward", "x");
    const matrix_type y = rows(y_in, out_, "forward", "y");
    const std::size_t n = x.extent(0);
    kat::detail::require_extent("kat::nn::Dense::forward", "x columns", in_, x.extent(1));
    kat::detail::require_extent("kat::nn::Dense::forward", "y rows", n, y.extent(0));
    kat::detail::require_extent("kat::nn::Dense::forward", "y columns", out_, y.extent(1));
    x_ = x;
    rounded_operands_ = false;
    kept_dy_data_ = nullptr;
    if (uses_sparse_path()) {
      forward_sparse(space, x, y);
      return;
    }
    if (this->recording_ && bias_) {
      // a = [x 1]; then y = a [W b]ᵀ is one GEMM that also adds the bias.
      record_activations(space, x);
      product_(space, this->precision_, Trans::N, Trans::T, Scalar(1), a_view_, weight_bias_,
               Scalar(0), y);
      return;
    }
    if (this->recording_) {
      record_activations(space, x);
    }
    if (this->precision_ == Precision::bf16) {
      // x and W rounded once: backward's dW = dyᵀx and dx = dy W reuse them. With a bias the
      // operands are [x 1] and [W b], so the product adds b (rounded to bf16, as autocast's
      // linear rounds it) instead of a pass writing b into y and the product adding to it.
      // (Without a bias, weight_bias_ is W.)
      if (bias_) {
        x_bf16_.assign_with_ones_column(space, x);
      } else {
        x_bf16_.assign(space, x);
      }
      w_bf16_.assign(space, weight_bias_);
      product_(space, Trans::N, Trans::T, Scalar(1), x_bf16_, w_bf16_, Scalar(0), y);
      rounded_operands_ = true;
      return;
    }
    if (bias_) {
      detail::fill_rows(space, "kat::nn::Dense::forward_bias", bias_view_, y); // y = b
    }
    product_(space, this->precision_, Trans::N, Trans::T, Scalar(1), x, weight_,
             Scalar(bias_ ? 1 : 0), y);
  }

  void backward(const execution_space &space, const matrix_type &dy,
                const matrix_type &dx) override {
    ScopedRegion region("kat::nn::Dense::backward");
    backward_impl(space, dy, dx, BackwardPart::whole);
  }

  /// @name Backward in two calls
  /// For a caller that overlaps the communication of dx with the parameter gradients' product
  /// (the column-parallel layer of Megatron-LM, sec. 3, kat::distributed::ColumnParallelDense):
  /// backward_input() computes dx = dy W alone, then backward_parameters() the parameter
  /// gradients from the same dy, together what one backward() computes, to the bit. In bf16 the
  /// second call reuses the first's rounding of dy instead of rounding it again.
  /// @{

  /// dx = dy W (dy: N x out, dx: N x in, as backward()), without the parameter gradients,
  /// whatever compute_parameter_gradients() says; a dense weight gradient requested with
  /// request_dense_weight_gradient() stays requested for the next call.
  /// @throws ShapeError if dy or dx has the wrong shape, or dx is empty.
  void backward_input(const execution_space &space, const matrix_type &dy, const matrix_type &dx) {
    ScopedRegion region("kat::nn::Dense::backward_input");
    if (dx.extent(0) == 0 && dx.extent(1) == 0) {
      throw ShapeError("kat::nn::Dense::backward_input: dx must not be empty (backward() "
                       "computes the parameter gradients alone)");
    }
    backward_impl(space, dy, dx, BackwardPart::input);
  }

  /// The parameter gradients [dW db] of backward() (set, or added in accumulate mode) from dy,
  /// which must be the dy of the backward_input() just before it, unchanged (the same view: in
  /// bf16 its rounding is reused; another view is rounded anew). Does nothing when
  /// compute_parameter_gradients(false) is in force.
  /// @throws ShapeError if dy has the wrong shape.
  void backward_parameters(const execution_space &space, const matrix_type &dy) {
    ScopedRegion region("kat::nn::Dense::backward_parameters");
    if (!this->parameter_gradients_) {
      kept_dy_data_ = nullptr;
      return;
    }
    backward_impl(space, dy, matrix_type(), BackwardPart::parameters);
  }
  /// @}
  /// One "Dense" operator {in, out, bias, positions} on [B, P, in] (per position) or [B, in]
  /// (flattened; a "Flatten" operator `name`_flatten first when the input has positions).
  plan::TensorId describe(plan::Graph &graph, plan::TensorId x, const FeatureShape &in,
                          const std::string &name) const override {
    const std::int64_t batch = graph.tensor(x).shape[0];
    const FeatureShape out = output_shape(in);
    std::int64_t positions = 1;
    if (per_position()) {
      positions = static_cast<std::int64_t>(in.height) * in.width;
    } else if (!in.is_flat()) {
      x = graph.add("Flatten", name + "_flatten", {x},
                    {batch, static_cast<std::int64_t>(in.size())});
    }
    plan::Attributes attributes{{"in", static_cast<std::int64_t>(in_)},
                                {"out", static_cast<std::int64_t>(out_)},
                                {"bias", bias_},
                                {"positions", positions}};
    return graph.add("Dense", name, {x}, graph_shape(batch, out), this->parameter_shapes(),
                     std::move(attributes));
  }

  bool supports_curvature() const override { return true; }
  CurvatureRecord<Scalar, MemorySpace> curvature() const override {
    return {a_view_, g_, grad_weight_bias_, weight_bias_, samples_};
  }

  /// R-operator (see Layer): R{y} = R{x} Wᵀ + x Vᵀ + v_b for the direction [V v_b];
  /// backward_r adds R{dW} = R{dy}ᵀ x + dyᵀ R{x} and R{db} = Σ_rows R{dy} to the product
  /// buffer (masked like dW when a weight mask is set) and writes R{dx} = R{dy} W + dy V.
  /// Dense products on either path (inactive weights are 0 in W; a direction's inactive
  /// entries take part in R{y}, as they would in the dense layer).
  bool supports_r_operator() const override { return true; }

  /// Binds the direction's and the product's W and b blocks, laid out like bind()'s.
  void bind_direction(Scalar *v, Scalar *hv) override {
    v_weight_ = matrix_type(v, out_, in_);
    hv_weight_ = matrix_type(hv, out_, in_);
    if (bias_) {
      v_bias_ = Vector<Scalar, MemorySpace>(v + out_ * in_, out_);
      hv_bias_ = Vector<Scalar, MemorySpace>(hv + out_ * in_, out_);
    }
  }

  void forward_r(const execution_space &space, const matrix_type &rx_in,
                 const matrix_type &ry_in) override {
    ScopedRegion region("kat::nn::Dense::forward_r");
    const matrix_type rx = rows(rx_in, in_, "forward_r", "rx");
    const matrix_type ry = rows(ry_in, out_, "forward_r", "ry");
    const std::size_t n = x_.extent(0);
    require_direction("forward_r");
    kat::detail::require_extent("kat::nn::Dense::forward_r", "ry rows", n, ry.extent(0));
    kat::detail::require_extent("kat::nn::Dense::forward_r", "ry columns", out_, ry.extent(1));
    rx_ = rx;
    if (bias_) {
      detail::fill_rows(space, "kat::nn::Dense::forward_r_bias", v_bias_, ry); // R{y} = v_b
    }
    gemm(space, Trans::N, Trans::T, Scalar(1), x_, v_weight_, Scalar(bias_ ? 1 : 0), ry);
    if (rx.extent(0) != 0) {
      kat::detail::require_extent("kat::nn::Dense::forward_r", "rx rows", n, rx.extent(0));
      kat::detail::require_extent("kat::nn::Dense::forward_r", "rx columns", in_, rx.extent(1));
      gemm(space, Trans::N, Trans::T, Scalar(1), rx, weight_, Scalar(1), ry);
    }
  }

  void backward_r(const execution_space &space, const matrix_type &dy_in, const matrix_type &rdy_in,
                  const matrix_type &rdx_in) override {
    ScopedRegion region("kat::nn::Dense::backward_r");
    const matrix_type dy = rows(dy_in, out_, "backward_r", "dy");
    const matrix_type rdy = rows(rdy_in, out_, "backward_r", "rdy");
    const matrix_type rdx = rows(rdx_in, in_, "backward_r", "rdx");
    const std::size_t n = x_.extent(0);
    require_direction("backward_r");
    kat::detail::require_extent("kat::nn::Dense::backward_r", "dy rows", n, dy.extent(0));
    kat::detail::require_extent("kat::nn::Dense::backward_r", "dy columns", out_, dy.extent(1));
    kat::detail::require_extent("kat::nn::Dense::backward_r", "rdy rows", n, rdy.extent(0));
    kat::detail::require_extent("kat::nn::Dense::backward_r", "rdy columns", out_, rdy.extent(1));
    const bool has_rx = rx_.extent(0) != 0;
    if (has_mask_) {
      // hv_W += mask ⊙ (R{dy}ᵀ x + dyᵀ R{x})
      const auto g = grad_scratch_.matrix(out_, in_);
      gemm(space, Trans::T, Trans::N, Scalar(1), rdy, x_, Scalar(0), g);
      if (has_rx) {
        gemm(space, Trans::T, Trans::N, Scalar(1), dy, rx_, Scalar(1), g);
      }
      detail::apply_weight_mask(space, mask_, g, hv_weight_, true);
    } else {
      gemm(space, Trans::T, Trans::N, Scalar(1), rdy, x_, Scalar(1), hv_weight_);
      if (has_rx) {
        gemm(space, Trans::T, Trans::N, Scalar(1), dy, rx_, Scalar(1), hv_weight_);
      }
    }
    if (bias_) {
      detail::column_sums(space, "kat::nn::Dense::backward_r_bias", rdy, hv_bias_, true);
    }
    if (rdx.extent(0) != 0) {
      kat::detail::require_extent("kat::nn::Dense::backward_r", "rdx rows", n, rdx.extent(0));
      kat::detail::require_extent("kat::nn::Dense::backward_r", "rdx columns", in_, rdx.extent(1));
      // R{dx} = R{dy} W + dy V
      gemm(space, Trans::N, Trans::N, Scalar(1), rdy, weight_, Scalar(0), rdx);
      gemm(space, Trans::N, Trans::N, Scalar(1), dy, v_weight_, Scalar(1), rdx);
    }
  }

private:
  /// per_position: the N x cols·P matrix m as the (N·P) x cols matrix of its rows (the same
  /// memory); flattened, or m of extent 0: m itself.
  /// @throws ShapeError if cols does not divide m's columns or m is not contiguous.
  matrix_type rows(const matrix_type &m, std::size_t cols, const char *what,
                   const char *arg) const {
    if (!per_position() || m.extent(0) == 0) {
      return m;
    }
    if (m.extent(1) % cols != 0 || m.extent(1) == 0) {
      throw ShapeError(kat::detail::concat("kat::nn::Dense::", what, ": ", arg,
                                           " columns must be a positive multiple of ", cols,
                                           " (features per position), got ", m.extent(1)));
    }
    if (m.extent(1) > 1 && m.stride(1) != m.extent(0)) {
      throw ShapeError(kat::detail::concat("kat::nn::Dense::", what, ": ", arg,
                                           " must be contiguous (column stride ", m.extent(0),
                                           "), got column stride ", m.stride(1)));
    }
    return detail::position_rows(m, cols);
  }

  void require_direction(const char *what) const {
    if (v_weight_.extent(0) == 0) {
      throw Error(
          kat::detail::concat("kat::nn::Dense::", what, ": no direction bound (bind_direction)"));
    }
  }

  void record_activations(const execution_space &space, const matrix_type &x) {
    const std::size_t n = x.extent(0);
    const std::size_t cols = in_ + (bias_ ? 1 : 0);
    a_view_ = a_.matrix(n, cols);
    detail::copy_with_ones_column(space, x, a_view_);
  }

  /// y = x Wᵀ + b over the active weights (the curvature record as on the dense path).
  void forward_sparse(const execution_space &space, const matrix_type &x, const matrix_type &y) {
    sparse_->build(space, mask_);
    if (this->recording_) {
      record_activations(space, x);
    }
    // beta = 0 and the bias added afterwards: KK 3.4's spmv with beta = 1 (y prefilled with
    // the bias) took 2.6x as long as with beta = 0 (784 -> 256, 5% density, batch 128).
    sparse_->multiply(space, weight_, x, Scalar(0), y);
    if (bias_) {
      detail::add_row_vector(space, "kat::nn::Dense::forward_add_bias", y, bias_view_, y);
    }
  }

  // Which calls backward_impl serves: backward() (the parameter gradients as
  // compute_parameter_gradients() says), backward_input() (dx only; keeps dy's bf16 rounding
  // for the next call) or backward_parameters() (no dx; reuses that rounding for the same view).
  enum class BackwardPart { whole, input, parameters };

  void backward_impl(const execution_space &space, const matrix_type &dy_in,
                     const matrix_type &dx_in, BackwardPart part) {
    const bool parameters =
        part == BackwardPart::whole ? this->parameter_gradients_ : part == BackwardPart::parameters;
    const bool kept = part == BackwardPart::parameters && kept_dy_data_ != nullptr &&
                      kept_dy_data_ == dy_in.data() && kept_dy_stride_ == dy_in.stride(1);
    kept_dy_data_ = nullptr;
    const matrix_type dy = rows(dy_in, out_, "backward", "dy");
    const matrix_type dx = rows(dx_in, in_, "backward", "dx");
    const std::size_t n = x_.extent(0);
    kat::detail::require_extent("kat::nn::Dense::backward", "dy rows", n, dy.extent(0));
    kat::detail::require_extent("kat::nn::Dense::backward", "dy columns", out_, dy.extent(1));
    if (this->recording_) {
      g_ = dy;
    }
    const bool accumulate = this->accumulate_;
    const bool sparse = uses_sparse_path();
    if (sparse) {
      sparse_->build(space, mask_);
    }
    const bool dense_gradient = !has_mask_ || dense_gradient_requested_;
    if (parameters) {
      dense_gradient_requested_ = false;
    }
    // bf16: x and W as forward rounded them, dy rounded once for both products (and for both
    // calls of backward_input() and backward_parameters()).
    const bool rounded = rounded_operands_ && !sparse && this->precision_ == Precision::bf16;
    const bool uses_dy_bf16 = rounded && (parameters || dx.extent(0) != 0);
    if (uses_dy_bf16 && !kept) {
      dy_bf16_.assign(space, dy);
    }
    if (part == BackwardPart::input && uses_dy_bf16) {
      kept_dy_data_ = dy_in.data();
      kept_dy_stride_ = dy_in.stride(1);
    }
    // out = dyᵀx + β out; in bf16, out = dyᵀ[x 1] + β out when out is [dW db] (in_ + 1 columns).
    const auto weight_gradient = [&](Scalar beta, const matrix_type &out) {
      if (rounded) {
        product_(space, Trans::T, Trans::N, Scalar(1), dy_bf16_.matrix(),
                 x_bf16_.leading_columns(out.extent(1)), beta, out);
      } else {
        product_(space, this->precision_, Trans::T, Trans::N, Scalar(1), dy, x_, beta, out);
      }
    };
    // bf16 with a bias: [dW db] (+)= dyᵀ [x 1] in one product, from the operand forward
    // rounded with its ones column; db then sums the rounded dy in fp32, as the bf16
    // convolutions' bias gradient does (and autocast's, which sums in bf16).
    const bool bias_in_product = rounded && bias_ && dense_gradient;
    if (!parameters) {
      // dx only (compute_parameter_gradients(false))
    } else if (bias_in_product) {
      // [dW db] (+)= dyᵀ [x 1]
      weight_gradient(Scalar(accumulate ? 1 : 0), grad_weight_bias_);
    } else if (dense_gradient) {
      // dW (+)= dyᵀ x
      weight_gradient(Scalar(accumulate ? 1 : 0), grad_weight_);
    } else if (sparse) {
      // dW (+)= mask ⊙ dyᵀ x, computed at the active entries only.
      sparse_->sampled_gradient(space, dy, x_, grad_weight_, accumulate);
    } else if (accumulate) {
      // dW += mask ⊙ dyᵀ x: the product goes to scratch first, inactive entries stay as they were.
      const auto g = grad_scratch_.matrix(out_, in_);
      weight_gradient(Scalar(0), g);
      detail::apply_weight_mask(space, mask_, g, grad_weight_, true);
    } else {
      // dW = mask ⊙ dyᵀ x
      weight_gradient(Scalar(0), grad_weight_);
      detail::apply_weight_mask(space, mask_, grad_weight_, grad_weight_, false);
    }
    if (bias_ && parameters && !bias_in_product) {
      // db (+)= column sums of dy
      detail::column_sums(space, "kat::nn::Dense::backward_bias", dy, grad_bias_, accumulate);
    }
    if (dx.extent(0) != 0) {
      kat::detail::require_extent("kat::nn::Dense::backward", "dx rows", n, dx.extent(0));
      kat::detail::require_extent("kat::nn::Dense::backward", "dx columns", in_, dx.extent(1));
      // dx = dy W
      if (sparse) {
        sparse_->multiply_transposed(space, weight_, dy, dx);
      } else if (rounded) {
        product_(space, Trans::N, Trans::N, Scalar(1), dy_bf16_.matrix(),
                 w_bf16_.leading_columns(in_), Scalar(0), dx);
      } else {
        product_(space, this->precision_, Trans::N, Trans::N, Scalar(1), dy, weight_, Scalar(0),
                 dx);
      }
    }
  }

  std::size_t in_, out_;
  bool bias_;
  DenseInput input_;
  std::size_t samples_ = 0; // N of the last forward (rows of x_ are N·P per position)
  matrix_type weight_bias_, grad_weight_bias_, weight_, grad_weight_;
  Vector<Scalar, MemorySpace> bias_view_, grad_bias_;
  matrix_type x_;
  Workspace<Scalar, MemorySpace> a_;
  matrix_type a_view_, g_;
  // R-operator: the direction's and the product's blocks, and R{x} of the last forward_r.
  matrix_type v_weight_, hv_weight_, rx_;
  Vector<Scalar, MemorySpace> v_bias_, hv_bias_;

  // Sparse weights: the mask snapshot, its active count, the path asked for, the crossover,
  // the CSR structure (built while the sparse path is in use) and scratch for the masked
  // dense gradient in accumulate mode.
  Kokkos::View<std::uint8_t *, MemorySpace> mask_;
  std::size_t active_ = 0;
  bool has_mask_ = false;
  SparsePath path_ = SparsePath::automatic;
  double crossover_ = kat::sparse::default_sparse_crossover;
  bool dense_gradient_requested_ = false;
  std::unique_ptr<detail::SparseProducts<Scalar, MemorySpace>> sparse_;
  Workspace<Scalar, MemorySpace> grad_scratch_;
  // forward() and backward()'s products in the layer's precision (Layer::set_precision).
  MixedPrecisionGemm<Scalar, MemorySpace> product_;
  // bf16: x and W as the last forward rounded them (valid while rounded_operands_), dy as
  // backward rounded it.
  Bf16Operand<Scalar, MemorySpace> x_bf16_, w_bf16_, dy_bf16_;
  bool rounded_operands_ = false;
  // The dy (its data and column stride) that backward_input() rounded into dy_bf16_, for
  // backward_parameters(); null when there is none to reuse.
  const Scalar *kept_dy_data_ = nullptr;
  std::size_t kept_dy_stride_ = 0;
};

} // namespace kat::nn
