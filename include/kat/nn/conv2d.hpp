#pragma once
/// @file
/// @brief 2-D convolution (torch.nn.Conv2d) as im2col + GEMM, with the patch matrix K-FAC
/// needs.

#include "kat/core/blas.hpp"
#include "kat/core/dnn.hpp"
#include "kat/core/error.hpp"
#include "kat/core/mixed_gemm.hpp"
#include "kat/core/profiling.hpp"
#include "kat/core/views.hpp"
#include "kat/core/workspace.hpp"
#include "kat/nn/activation.hpp"
#include "kat/nn/detail/conv2d_kernels.hpp"
#include "kat/nn/detail/image.hpp"
#include "kat/nn/init.hpp"
#include "kat/nn/layer.hpp"

#include <Kokkos_Core.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace kat::nn {

namespace detail {

/// im2col (Chellapilla, Puri & Simard 2006) for the output positions p = oh + H_out * ow in
/// [p0, p1): writes the (n * (p1 - p0)) x cols column-major matrix `patches` whose row
/// `b + n * (p - p0)` holds sample b's receptive field at position p, column
/// k = i + k_h * (j + k_w * c) being input (b, c, oh s_h - p_h + i d_h, ow s_w - p_w + j d_w)
/// (0 in the padding), and column K (when cols == K + 1) being 1.
///
/// One team per patch column; its threads take the output columns ow the range touches. For
/// one (k, ow) the rows are contiguous in `patches`, and with stride_h == 1 the valid ones are
/// also contiguous in x, so the copy is a single run. With Out = kat::bfloat16 the entries are
/// rounded to bf16 as they are written (the patches of a bf16 product).
template <class ExecSpace, class Scalar, class Out>
void conv2d_im2col(const ExecSpace &space, const Conv2dGeometry &g, std::size_t n, const Scalar *x,
                   std::size_t p0, std::size_t p1, std::size_t cols, Out *patches) {
  using policy = Kokkos::TeamPolicy<ExecSpace>;
  const std::size_t ho = static_cast<std::size_t>(g.out_height);
  const std::size_t rows = n * (p1 - p0);
  const std::size_t ow_first = p0 / ho;
  const int ow_count = static_cast<int>((p1 - 1) / ho - ow_first + 1);
  const int patch = static_cast<int>(g.patch_size());
  Kokkos::parallel_for(
      "kat::nn::Conv2d::im2col",
      policy(space, static_cast<int>(cols), Kokkos::AUTO, batch_vector_length<ExecSpace>()),
      Conv2dIm2col<ExecSpace, Scalar, Out>{g, n, x, p0, p1, patches, ho, rows, ow_first, ow_count,
                                           patch});
}

/// col2im as a gather: every input element (b, c, ih, iw) of the band [ih_lo, ih_hi] x
/// [iw_lo, iw_hi] (all channels) adds, over the kernel offsets (i, j) in order, the dP entry
/// of the output position (oh, ow) = ((ih + p_h - i d_h) / s_h, (iw + p_w - j d_w) / s_w)
/// whose window covers it (both divisions exact and in range), for the positions
/// p = oh + H_out ow in [s0, s1) only. `dpatches` holds the rows of positions
/// [pbase, pbase + rows / n) (rows as in conv2d_im2col, column stride `rows`, K columns), and
/// must cover [s0, s1). With `overwrite` the element is set to that sum instead. Each element
/// is written by one thread in a fixed order: deterministic, no atomics.
template <class ExecSpace, class Scalar>
void conv2d_col2im(const ExecSpace &space, const Conv2dGeometry &g, std::size_t n,
                   const Scalar *dpatches, std::size_t rows, std::size_t pbase, std::size_t s0,
                   std::size_t s1, Scalar *dx, int ih_lo, int ih_hi, int iw_lo, int iw_hi,
                   bool overwrite) {
  using policy = Kokkos::TeamPolicy<ExecSpace>;
  const int band_h = ih_hi - ih_lo + 1;
  const int band_w = iw_hi - iw_lo + 1;
  const long long base = static_cast<long long>(pbase);
  const long long first = static_cast<long long>(s0);
  const long long last = static_cast<long long>(s1);
  // One kernel tap down is d = step_q s + step_r.
  const int step_qh = g.dilation_h / g.stride_h, step_rh = g.dilation_h % g.stride_h;
  const int step_qw = g.dilation_w / g.stride_w, step_rw = g.dilation_w % g.stride_w;
  Kokkos::parallel_for(
      "kat::nn::Conv2d::col2im",
      policy(space, g.in_channels * band_w, Kokkos::AUTO, batch_vector_length<ExecSpace>()),
      Conv2dCol2im<ExecSpace, Scalar>{g, n, dpatches, rows, dx, ih_lo, iw_lo, overwrite, band_h,
                                      band_w, base, first, last, step_qh, step_rh, step_qw,
                                      step_rw});
}

} // namespace detail

/// How Conv2d computes its forward and backward passes.
enum class Conv2dBackend {
  /// The vendor DNN library (kat/core/dnn.hpp: oneDNN) where it serves the layer's memory
  /// space and scalar and curvature is not being recorded, im2col + GEMM otherwise.
  automatic,
  /// Always im2col + GEMM (the portable path).
  im2col,
  /// The vendor DNN library except while recording curvature (which needs the patch
  /// matrix); Conv2d::set_backend refuses it where kat::dnn_available is false.
  dnn,
};

/// 2-D convolution with PyTorch's semantics (torch.nn.Conv2d with groups = 1,
/// padding_mode = "zeros"), computed through the vendor DNN library (oneDNN's direct
/// convolutions, kat/core/dnn.hpp) where it serves the memory space and scalar, otherwise
/// as im2col + GEMM (Chellapilla, Puri & Simard, "High Performance Convolutional Neural
/// Networks for Document Processing", IWFHR 2006); see Conv2dBackend and set_backend().
///
/// Shapes: input (C_in, H, W), a batch is N x (C_in·H·W) in KAT's feature order
/// `h + H * (w + W * c)` (see FeatureShape); output (C_out, H_out, W_out) with
/// H_out = floor((H + 2 p_h - d_h (k_h - 1) - 1) / s_h) + 1 and likewise W_out.
///
/// Parameters: [W b] is ONE C_out x (K + 1) column-major matrix in the flat buffer
/// (C_out x K without bias), K = C_in·k_h·k_w, exactly as Dense keeps [W b], so K-FAC treats
/// convolutions and dense layers alike. Patch column k = i + k_h (j + k_w c) holds kernel row
/// i, kernel column j, input channel c: W(o, i + k_h (j + k_w c)) is PyTorch's
/// weight[o][c][i][j]. Initialization follows torch.nn.Conv2d: W ~ kaiming_uniform(a = √5,
/// fan_in = K), i.e. U(-1/√K, 1/√K), and b ~ U(-1/√K, 1/√K).
///
/// The patch matrix P has one row r = b + N (oh + H_out ow) per (sample, output position) —
/// batch fastest, as the output — so Y = P [W b]ᵀ, an (N·H_out·W_out) x C_out column-major
/// matrix, IS the output batch y in memory and is written by the GEMM directly. Backward:
/// d[W b] (+)= dYᵀ P, dP = dY W, dx = col2im(dP) as a gather (deterministic, no atomics).
///
/// Three execution paths give the same results up to floating-point summation order:
/// - DNN (default where kat::dnn_available<execution_space, Scalar>(): float on host memory
///   in a build with KAT_ENABLE_ONEDNN, and not recording curvature): oneDNN's forward,
///   backward-data and backward-weights primitives, with x and dy reordered into the layouts
///   oneDNN chooses and y, dx, d[W b] reordered back where those differ from the layer's
///   (dnn_reorder_stats() counts them; in fp32 channels_last oneDNN reads and writes the
///   activations as they are, see OnednnConv2dPlan);
/// - full (while recording curvature): P (with its ones column) is built once for the whole
///   batch and kept for backward and for curvature();
/// - chunked (default elsewhere): the output positions are processed in chunks of contiguous
///   positions p = oh + H_out ow, whose patch block is about chunk_bytes() (see
///   set_chunk_bytes()). A chunk's rows of Y are a contiguous row range, so each chunk's GEMM
///   writes straight into y (a strided view, leading dimension N·H_out·W_out) and reads dY
///   the same way. The block stays in cache between im2col and the GEMMs instead of streaming
///   N·H_out·W_out·(K+1) scalars through memory twice. Backward walks the chunks last to
///   first: the last block is still in the workspace from forward(), the others are rebuilt.
///   The first chunk it processes writes every dx element, the others add to them.
///   In Precision::bf16, where the bf16 GEMM reads bf16 storage (cuBLAS on CUDA memory,
///   oneDNN's matmul on host memory: kat::Bf16Operand::stores_bf16), im2col writes the chunk's
///   patches as bf16 directly, [W b] and each chunk of dY are rounded once for both of their
///   products, and the patch blocks take half the memory.
///
/// As MaxPool2d, the layer learns H and W from output_shape(), which Sequential::add calls;
/// a standalone layer must be given its input shape that way before forward().
template <class Scalar = float, class MemorySpace = DefaultMemorySpace>
class Conv2d final : public Layer<Scalar, MemorySpace> {
  using base = Layer<Scalar, MemorySpace>;

public:
  using typename base::execution_space;
  using typename base::matrix_type;
  using vector_type = Vector<Scalar, MemorySpace>; ///< the bias vector (C_out)

  /// Default size of one chunk's patch block. In host memory 8 MiB: small enough to stay in
  /// cache between im2col and the GEMMs, large enough that the per-chunk costs (BLAS calls and
  /// their thread wake-ups, the col2im band edges) stay small; it was the fastest of
  /// 0.25-16 MiB for the Fashion-MNIST CNN's convolutions on a 2-core Xeon
  /// (bench/bench_conv.cpp). In device memory 0 (no chunking): GPUs stream memory fast
  /// enough that one large GEMM beats many small ones.
  static constexpr std::size_t default_chunk_bytes =
      Kokkos::SpaceAccessibility<Kokkos::HostSpace, MemorySpace>::accessible ? std::size_t(8) << 20
                                                                             : std::size_t(0);

  /// @param in_channels, out_channels  C_in, C_out, >= 1
  /// @param kernel    (height, width) of the kernel, >= 1
  /// @param stride    (height, width) step, >= 1
  /// @param padding   (height, width) implicit zero padding per side, >= 0
  /// @param dilation  (height, width) spacing of kernel taps, >= 1
  /// @param bias      whether to learn b
  /// @throws ValueError naming the argument, expected and actual value, on a value outside
  ///         those ranges.
  Conv2d(std::size_t in_channels, std::size_t out_channels, std::array<int, 2> kernel,
         std::array<int, 2> stride = {1, 1}, std::array<int, 2> padding = {0, 0},
         std::array<int, 2> dilation = {1, 1}, bool bias = true)
      : bias_(bias) {
    const char *where = "kat::nn::Conv2d: ";
    const auto max_int = static_cast<std::size_t>(std::numeric_limits<int>::max());
    if (in_channels == 0 || in_channels > max_int) {
      throw ValueError(kat::detail::concat(where, "in_channels must be in [1, ", max_int, "], got ",
                                           in_channels));
    }
    if (out_channels == 0 || out_channels > max_int) {
      throw ValueError(kat::detail::concat(where, "out_channels must be in [1, ", max_int,
                                           "], got ", out_channels));
    }
    if (kernel[0] < 1 || kernel[1] < 1) {
      throw ValueError(kat::detail::concat(where, "kernel must be >= 1 in both dimensions, got ",
                                           detail::format_pair(kernel)));
    }
    if (stride[0] < 1 || stride[1] < 1) {
      throw ValueError(kat::detail::concat(where, "stride must be >= 1 in both dimensions, got ",
                                           detail::format_pair(stride)));
    }
    if (padding[0] < 0 || padding[1] < 0) {
      throw ValueError(kat::detail::concat(where, "padding must be >= 0 in both dimensions, got ",
                                           detail::format_pair(padding)));
    }
    if (dilation[0] < 1 || dilation[1] < 1) {
      throw ValueError(kat::detail::concat(where, "dilation must be >= 1 in both dimensions, got ",
                                           detail::format_pair(dilation)));
    }
    geometry_.in_channels = static_cast<int>(in_channels);
    geometry_.out_channels = static_cast<int>(out_channels);
    geometry_.kernel_h = kernel[0];
    geometry_.kernel_w = kernel[1];
    geometry_.stride_h = stride[0];
    geometry_.stride_w = stride[1];
    geometry_.pad_h = padding[0];
    geometry_.pad_w = padding[1];
    geometry_.dilation_h = dilation[0];
    geometry_.dilation_w = dilation[1];
  }

  /// Square kernel, stride, padding and dilation; `model.add<Conv2d>(1, 32, 5, 1, 2)`.
  /// @throws ValueError as above.
  Conv2d(std::size_t in_channels, std::size_t out_channels, int kernel, int stride = 1,
         int padding = 0, int dilation = 1, bool bias = true)
      : Conv2d(in_channels, out_channels, std::array<int, 2>{kernel, kernel},
               std::array<int, 2>{stride, stride}, std::array<int, 2>{padding, padding},
               std::array<int, 2>{dilation, dilation}, bias) {}

  std::string name() const override { return "Conv2d"; }
  /// C_in, the input channels.
  std::size_t in_channels() const { return static_cast<std::size_t>(geometry_.in_channels); }
  /// C_out, the output channels.
  std::size_t out_channels() const { return static_cast<std::size_t>(geometry_.out_channels); }
  /// (height, width) of the kernel.
  std::array<int, 2> kernel() const { return {geometry_.kernel_h, geometry_.kernel_w}; }
  /// (vertical, horizontal) stride.
  std::array<int, 2> stride() const { return {geometry_.stride_h, geometry_.stride_w}; }
  /// (vertical, horizontal) zero padding on each side.
  std::array<int, 2> padding() const { return {geometry_.pad_h, geometry_.pad_w}; }
  /// (vertical, horizontal) dilation.
  std::array<int, 2> dilation() const { return {geometry_.dilation_h, geometry_.dilation_w}; }
  /// Whether the layer has a bias.
  bool has_bias() const { return bias_; }
  /// K = C_in·k_h·k_w, the columns of W.
  std::size_t patch_size() const { return geometry_.patch_size(); }

  /// Target size in bytes of one chunk's patch block on the chunked path (default
  /// default_chunk_bytes): a chunk holds max(1, bytes / (N·(K+1)·sizeof(Scalar))) output
  /// positions of all N samples (K instead of K+1 without bias). 0 never chunks: one block for
  /// the whole batch, not kept. Has no effect while recording curvature, which always builds
  /// and keeps the whole P.
  void set_chunk_bytes(std::size_t bytes) { chunk_bytes_ = bytes; }
  /// The chunk size set by set_chunk_bytes(), in bytes.
  std::size_t chunk_bytes() const { return chunk_bytes_; }

  /// Chooses the path of later forward() calls (default Conv2dBackend::automatic). Recording
  /// curvature takes the full im2col path whatever the choice: K-FAC needs the patch matrix.
  /// @throws ValueError for Conv2dBackend::dnn where kat::dnn_available<execution_space,
  ///         Scalar>() is false (no oneDNN in this build, a double layer, or device memory).
  void set_backend(Conv2dBackend backend) {
    if (backend == Conv2dBackend::dnn && !dnn_available<execution_space, Scalar>()) {
      throw ValueError("kat::nn::Conv2d::set_backend: backend dnn needs a vendor DNN library "
                       "for this layer (oneDNN, KAT_ENABLE_ONEDNN, float, host memory); "
                       "kat::dnn_available is false here");
    }
    backend_ = backend;
  }
  /// The path chosen by set_backend().
  Conv2dBackend backend() const { return backend_; }
  /// Whether the DNN library serves the layer in its current mode (oneDNN in this build for
  /// its space and scalar, backend not im2col, not recording curvature). With
  /// Conv2dBackend::automatic a forward in KAT's layout on both sides still takes im2col when
  /// K is small (automatic_min_patch_size).
  bool uses_dnn() const {
    return dnn_available<execution_space, Scalar>() && backend_ != Conv2dBackend::im2col &&
           !this->recording_;
  }

  /// With Conv2dBackend::automatic and KAT's layout on both sides, convolutions with fewer
  /// patch columns K = C_in·k_h·k_w than this stay on im2col: there the two reorders around
  /// oneDNN cost more than its faster arithmetic saves (bench/bench_conv.cpp,
  /// BM_Conv2dBackends, 2 AMD EPYC cores: K = 9, 16, 25 ran 0.38-0.93x im2col's speed, K =
  /// 144 and more 1.2-2.3x; with oneDNN's layout on both sides every shape ran 1.8-3.8x).
  static constexpr std::size_t automatic_min_patch_size = 64;

  /// Whether a forward with these layouts runs through the DNN library.
  bool dnn_for(ActivationLayout in, ActivationLayout out) const {
    if (!uses_dnn()) {
      return false;
    }
    return backend_ == Conv2dBackend::dnn || in != ActivationLayout::features ||
           out != ActivationLayout::features || patch_size() >= automatic_min_patch_size;
  }
  /// Whether the DNN path computes in `layout` in the current precision: in fp32 channels16
  /// where oneDNN's f32 convolutions compute in it (AVX-512 CPUs), else channels_last
  /// (kat::detail::dnn_f32_layout(): oneDNN has only reference kernels for nChw16c below
  /// AVX-512, for its pooling and batch normalization too); in bf16 channels_last, channels16 and
  /// their bf16-storage forms channels_last_bf16 and channels16_bf16 (oneDNN's AMX convolutions
  /// read bf16 channels last, its AVX512-BF16 ones nChw16c; which one LayerChain prefers
  /// follows kat::detail::dnn_bf16_blocked()). KAT's features layout is not one of them.
  bool dnn_layout(ActivationLayout layout) const {
    if (this->precision_ == Precision::bf16) {
      return layout != ActivationLayout::features;
    }
    return layout == kat::detail::dnn_f32_layout();
  }

  /// KAT's features layout; in training on the DNN path also a dnn_layout() (channels16 and
  /// channels16_bf16 for a side whose channel count is a multiple of 16; channels_last and
  /// channels_last_bf16, in bf16 where oneDNN has bf16 convolutions, for any), unless an
  /// R-operator direction is bound (the R passes build patch matrices from x in KAT's layout;
  /// kat::nn::hessian_vector_product runs the model in evaluation mode, so in KAT's layout).
  bool supports_layouts(ActivationLayout in, ActivationLayout out) const override {
    const bool dnn = uses_dnn() && this->training_ && v_weight_bias_.extent(0) == 0 &&
                     (this->precision_ == Precision::fp32 || kat::detail::dnn_bf16_convolutions());
    const auto ok = [&](ActivationLayout l, int channels) {
      return l == ActivationLayout::features ||
             (dnn && dnn_layout(l) && layout_fits(l, channels, this->precision_));
    };
    return ok(in, geometry_.in_channels) && ok(out, geometry_.out_channels);
  }

  /// On the DNN path in training, unless an R-operator direction is bound: y = max(0, conv(x)
  /// + b) inside oneDNN's convolution (an eltwise post-op), and backward masks dy where
  /// y <= 0 (one pass, as the ReLU's own backward). On im2col the GEMM writes y, and a ReLU
  /// would be one more pass anyway, so no fusion there.
  bool can_fuse_relu() const override {
    return this->training_ && v_weight_bias_.extent(0) == 0 &&
           dnn_for(this->in_layout_, this->out_layout_);
  }

  /// The layout conversions the DNN path has done so far (zeros on the other paths).
  DnnReorderStats dnn_reorder_stats() const {
    if constexpr (dnn_available<execution_space, Scalar>()) {
      return dnn_.reorder_stats();
    } else {
      return {};
    }
  }

  /// (C_in, H, W) -> (C_out, H_out, W_out), PyTorch's rule (see the class comment). Also
  /// records `input` as the shape forward() takes (Sequential::add calls this once; calling
  /// it again with another shape re-targets the layer).
  /// @throws ShapeError if input.channels != in_channels(), H or W < 1, or H_out or W_out < 1.
  FeatureShape output_shape(const FeatureShape &input) const override {
    const char *where = "kat::nn::Conv2d";
    kat::detail::require_extent(where, "input channels", geometry_.in_channels, input.channels);
    if (input.height < 1 || input.width < 1) {
      throw ShapeError(
          kat::detail::concat(where, ": input height and width must be >= 1, got ", input));
    }
    detail::Conv2dGeometry g = geometry_;
    const int span_h = g.dilation_h * (g.kernel_h - 1) + 1;
    const int span_w = g.dilation_w * (g.kernel_w - 1) + 1;
    const int padded_h = input.height + 2 * g.pad_h;
    const int padded_w = input.width + 2 * g.pad_w;
    if (padded_h < span_h || padded_w < span_w) {
      throw ShapeError(kat::detail::concat(
          where, ": input ", input, " with padding ", detail::format_pair(padding()),
          " must be at least the dilated kernel ", detail::format_pair({span_h, span_w}),
          " in height and width (so that H_out, W_out >= 1), got ",
          detail::format_pair({padded_h, padded_w}), " after padding"));
    }
    g.height = input.height;
    g.width = input.width;
    g.out_height = (padded_h - span_h) / g.stride_h + 1;
    g.out_width = (padded_w - span_w) / g.stride_w + 1;
    geometry_ = g;
    return FeatureShape{g.out_channels, g.out_height, g.out_width};
  }

  std::size_t parameter_count() const override { return out_channels() * weight_columns(); }

  /// "weight" (out_channels x in_channels·kh·kw, column-major) then, with a bias, "bias"
  /// (out_channels).
  std::vector<ParameterSpec> parameter_specs() const override {
    const std::size_t out = out_channels(), k = patch_size();
    std::vector<ParameterSpec> specs{{"weight", ParameterRole::weight, {out, k}, 0}};
    if (bias_) {
      specs.push_back({"bias", ParameterRole::bias, {out}, out * k});
    }
    return specs;
  }

  /// Binds W (C_out x K, column-major) followed by the bias (C_out), so that [W b] is one
  /// C_out x (K+1) column-major matrix, K-FAC's gradient.
  void bind(Scalar *params, Scalar *grads) override {
    const std::size_t out = out_channels(), k = patch_size();
    weight_bias_ = matrix_type(params, out, weight_columns());
    grad_weight_bias_ = matrix_type(grads, out, weight_columns());
    weight_ = matrix_type(params, out, k);
    grad_weight_ = matrix_type(grads, out, k);
    if (bias_) {
      bias_view_ = vector_type(params + out * k, out);
      grad_bias_ = vector_type(grads + out * k, out);
    }
  }

  void reset_parameters(const execution_space &space, std::uint64_t seed) override {
    const std::size_t k = patch_size();
    vector_type w(weight_.data(), out_channels() * k);
    kaiming_uniform_(space, w, k, std::sqrt(5.0), seed, 0);
    if (bias_) {
      const double bound = 1.0 / std::sqrt(static_cast<double>(k));
      uniform_(space, bias_view_, -bound, bound, seed, 1);
    }
  }

  /// W (C_out x K), a view of the flat parameter buffer.
  const matrix_type &weight() const { return weight_; }
  /// b (C_out), empty without bias.
  const vector_type &bias() const { return bias_view_; }
  /// dL/dW (C_out x K), a view of the flat gradient buffer.
  const matrix_type &weight_gradient() const { return grad_weight_; }
  /// dL/db (C_out), empty without bias.
  const vector_type &bias_gradient() const { return grad_bias_; }

  /// y = conv(x). x: N x (C_in·H·W), y: N x (C_out·H_out·W_out), both contiguous.
  /// @throws Error if the input shape is unknown (see output_shape()); ShapeError on wrong
  ///         extents or a non-contiguous x or y.
  void forward(const execution_space &space, const matrix_type &x, const matrix_type &y) override {
    ScopedRegion region("kat::nn::Conv2d::forward");
    const char *where = "kat::nn::Conv2d::forward";
    if (geometry_.height == 0) {
      throw Error(kat::detail::concat(where, ": the input shape is unknown; call "
                                             "output_shape(input) first (Sequential::add does)"));
    }
    const detail::Conv2dGeometry g = geometry_;
    const std::size_t n = x.extent(0);
    kat::detail::require_extent(where, "x columns", g.in_size(), x.extent(1));
    kat::detail::require_extent(where, "y rows", n, y.extent(0));
    kat::detail::require_extent(where, "y columns", g.out_size(), y.extent(1));
    require_contiguous(where, "x", x);
    require_contiguous(where, "y", y);
    forward_geometry_ = g;
    batch_ = n;
    forwarded_ = true;
    full_ = this->recording_;
    x_ = x;
    kept_ = {};
    kept16_ = {};
    a_view_ = matrix_type();
    g_ = matrix_type();
    dnn_forwarded_ = false;
    if (n == 0) {
      return;
    }
    forward_layouts_ = {this->in_layout_, this->out_layout_};
    forward_fused_ = this->fused_relu_;
    relu_.remember(y, this->out_layout_);
    this->require_layouts_supported(where);
    if constexpr (dnn_available<execution_space, Scalar>()) {
      if (dnn_for(this->in_layout_, this->out_layout_) &&
          dnn_.supports(dnn_problem())) { // (fused ReLUs take this path)
        dnn_.forward(space, dnn_problem(), x.data(), weight_.data(),
                     bias_ ? bias_view_.data() : nullptr, y.data());
        dnn_forwarded_ = true;
        return;
      }
    }
    if (this->in_layout_ != ActivationLayout::features ||
        this->out_layout_ != ActivationLayout::features) {
      // Only the DNN library reads and writes the other layouts (supports_layouts()).
      throw Error(kat::detail::concat(where, ": layouts ", to_string(this->in_layout_), " -> ",
                                      to_string(this->out_layout_),
                                      " need the DNN library, which refused this convolution"));
    }
    const std::size_t positions = g.positions(), cols = weight_columns();
    // Y = P [W b]ᵀ is (N·H_out·W_out) x C_out column-major: exactly y's memory.
    const matrix_type y_rows(y.data(), n * positions, out_channels());
    if constexpr (bf16_operand::stores_bf16) {
      if (this->precision_ == Precision::bf16 && !full_) {
        forward_bf16(space, x.data(), y_rows);
        return;
      }
    }
    const std::size_t step = full_ ? positions : chunk_positions(n, cols);
    if (full_) {
      a_view_ = a_.matrix(n * positions, cols);
    } else {
      reserve_chunk(patches_, n, cols);
    }
    for (std::size_t p0 = 0; p0 < positions; p0 += step) {
      const std::size_t p1 = std::min(positions, p0 + step);
      const matrix_type p_c = full_ ? a_view_ : patches_.matrix(n * (p1 - p0), cols);
      {
        ScopedRegion im2col_region("kat::nn::Conv2d::im2col");
        detail::conv2d_im2col(space, g, n, x.data(), p0, p1, cols, p_c.data());
      }
      product_(space, this->precision_, Trans::N, Trans::T, Scalar(1), p_c, weight_bias_, Scalar(0),
               Kokkos::subview(y_rows, std::make_pair(n * p0, n * p1), Kokkos::ALL()));
      if (!full_) {
        kept_ = {p0, p1, p_c.data()};
      }
    }
  }

  /// Given dy = dL/dy (N x (C_out·H_out·W_out), contiguous), adds d[W b] to the gradient
  /// buffer (or overwrites it, see accumulate_gradients()) and, unless dx is empty, writes
  /// dx = dL/dx (N x (C_in·H·W), contiguous).
  /// @throws Error before forward(); ShapeError on wrong extents.
  void backward(const execution_space &space, const matrix_type &dy,
                const matrix_type &dx) override {
    ScopedRegion region("kat::nn::Conv2d::backward");
    const char *where = "kat::nn::Conv2d::backward";
    if (!forwarded_) {
      throw Error(kat::detail::concat(where, ": call forward() first"));
    }
    const detail::Conv2dGeometry g = forward_geometry_;
    const std::size_t n = batch_;
    kat::detail::require_extent(where, "dy rows", n, dy.extent(0));
    kat::detail::require_extent(where, "dy columns", g.out_size(), dy.extent(1));
    require_contiguous(where, "dy", dy);
    const bool want_dx = dx.extent(0) != 0;
    if (want_dx) {
      kat::detail::require_extent(where, "dx rows", n, dx.extent(0));
      kat::detail::require_extent(where, "dx columns", g.in_size(), dx.extent(1));
      require_contiguous(where, "dx", dx);
    }
    const bool accumulate = this->accumulate_;
    if (n == 0) {
      if (!accumulate) {
        Kokkos::deep_copy(space, grad_weight_bias_, Scalar(0));
      }
      return;
    }
    const bool want_dw = this->parameter_gradients_;
    if constexpr (dnn_available<execution_space, Scalar>()) {
      if (dnn_forwarded_) {
        // The fused ReLU's backward first.
        const Scalar *g = forward_fused_ ? relu_.mask(space, dy).data() : dy.data();
        dnn_.backward(space, dnn_problem(), x_.data(), g, weight_.data(),
                      want_dx ? dx.data() : nullptr, want_dw ? grad_weight_.data() : nullptr,
                      bias_ ? grad_bias_.data() : nullptr, accumulate);
        return;
      }
    }
    const std::size_t positions = g.positions(), cols = weight_columns(), k = patch_size();
    const matrix_type dy_rows(dy.data(), n * positions, out_channels());
    if constexpr (bf16_operand::stores_bf16) {
      if (this->precision_ == Precision::bf16 && !full_) {
        backward_bf16(space, dy_rows, want_dw, want_dx, accumulate, dx.data());
        return;
      }
    }
    if (full_) {
      g_ = dy_rows;
      if (want_dw) {
        product_(space, this->precision_, Trans::T, Trans::N, Scalar(1), dy_rows, a_view_,
                 Scalar(accumulate ? 1 : 0), grad_weight_bias_);
      }
      if (want_dx) {
        const matrix_type dp = dpatches_.matrix(n * positions, k);
        product_(space, this->precision_, Trans::N, Trans::N, Scalar(1), dy_rows, weight_,
                 Scalar(0), dp);
        col2im_chunk(space, dp, 0, positions, true, dx.data());
      }
      return;
    }
    const std::size_t step = chunk_positions(n, cols);
    reserve_chunk(patches_, n, cols);
    if (want_dx) {
      reserve_chunk(dpatches_, n, cols);
    }
    chunks_last_first(positions, step, [&](std::size_t p0, std::size_t p1, bool first) {
      const auto dy_c = Kokkos::subview(dy_rows, std::make_pair(n * p0, n * p1), Kokkos::ALL());
      if (want_dw) {
        const matrix_type p_c = chunk_patches(space, x_.data(), p0, p1, cols, patches_, kept_);
        product_(space, this->precision_, Trans::T, Trans::N, Scalar(1), dy_c, p_c,
                 Scalar(accumulate || !first ? 1 : 0), grad_weight_bias_);
      }
      if (want_dx) {
        const matrix_type dp_c = dpatches_.matrix(n * (p1 - p0), k);
        product_(space, this->precision_, Trans::N, Trans::N, Scalar(1), dy_c, weight_, Scalar(0),
                 dp_c);
        col2im_chunk(space, dp_c, p0, p1, first, dx.data());
      }
    });
  }

  bool supports_curvature() const override { return true; }

  /// While recording (and after a forward/backward): a = P, the (N·H_out·W_out) x (K+1)
  /// patch matrix with its ones column (x K without bias); g = dL/dY, the
  /// (N·H_out·W_out) x C_out view of dy as given (including the 1/N of a batch-mean loss);
  /// weight_gradient = d[W b] and weight = [W b] (C_out x (K+1)). These are the conv
  /// quantities of docs/algorithms.md section 1; forming A = aᵀa / (N·H_out·W_out) and
  /// G = gᵀg / (N·H_out·W_out) (after undoing the 1/N) is the preconditioner's job.
  CurvatureRecord<Scalar, MemorySpace> curvature() const override {
    return {a_view_, g_, grad_weight_bias_, weight_bias_, batch_};
  }

  /// @name R-operator (see Layer)
  /// The convolution is linear in x and in [W b], so for the direction [V v_b] (laid out like
  /// [W b]) and R{x}:
  ///   R{y} = conv(R{x}, W) + conv(x, V) + v_b,             i.e. R{Y} = P(R{x}) Wᵀ + P [V v_b]ᵀ,
  ///   R{d[W b]} = R{dY}ᵀ P + [dYᵀ P(R{x})  0]               (R{db} = Σ R{dY}, the ones column),
  ///   R{dx} = col2im(R{dY} W + dY V),
  /// with P = P(x) the patch matrix of the class comment and P(R{x}) that of R{x} (without the
  /// ones column). The R{x} terms are skipped when rx has extent 0. The passes run on the path
  /// and the chunks of the last forward(), reusing the patch blocks still in the workspaces
  /// (R{x}'s in a workspace of their own).
  /// @{
  bool supports_r_operator() const override { return true; }

  /// Binds the direction's and the product's blocks, laid out like bind()'s.
  void bind_direction(Scalar *v, Scalar *hv) override {
    const std::size_t out = out_channels(), k = patch_size();
    v_weight_bias_ = matrix_type(v, out, weight_columns());
    v_weight_ = matrix_type(v, out, k);
    hv_weight_bias_ = matrix_type(hv, out, weight_columns());
    hv_weight_ = matrix_type(hv, out, k);
  }

  /// ry = R{y} (N x (C_out·H_out·W_out), contiguous) for R{x} = rx (N x (C_in·H·W),
  /// contiguous; extent 0: zero), after forward().
  /// @throws Error before forward() or bind_direction(); ShapeError on wrong extents.
  void forward_r(const execution_space &space, const matrix_type &rx,
                 const matrix_type &ry) override {
    ScopedRegion region("kat::nn::Conv2d::forward_r");
    const char *where = "kat::nn::Conv2d::forward_r";
    require_r_ready(where);
    const detail::Conv2dGeometry g = forward_geometry_;
    const std::size_t n = batch_;
    kat::detail::require_extent(where, "ry rows", n, ry.extent(0));
    kat::detail::require_extent(where, "ry columns", g.out_size(), ry.extent(1));
    require_contiguous(where, "ry", ry);
    const bool has_rx = rx.extent(0) != 0;
    if (has_rx) {
      kat::detail::require_extent(where, "rx rows", n, rx.extent(0));
      kat::detail::require_extent(where, "rx columns", g.in_size(), rx.extent(1));
      require_contiguous(where, "rx", rx);
    }
    rx_ = rx;
    kept_r_ = {};
    if (n == 0) {
      return;
    }
    const std::size_t positions = g.positions(), cols = weight_columns(), k = patch_size();
    const matrix_type ry_rows(ry.data(), n * positions, out_channels());
    const std::size_t step = full_ ? positions : chunk_positions(n, cols);
    if (!full_) {
      reserve_chunk(patches_, n, cols);
    }
    if (has_rx && !full_) {
      reserve_chunk(r_patches_, n, k);
    }
    chunks_last_first(positions, step, [&](std::size_t p0, std::size_t p1, bool) {
      const matrix_type p_c =
          full_ ? a_view_ : chunk_patches(space, x_.data(), p0, p1, cols, patches_, kept_);
      const auto ry_c = Kokkos::subview(ry_rows, std::make_pair(n * p0, n * p1), Kokkos::ALL());
      gemm(space, Trans::N, Trans::T, Scalar(1), p_c, v_weight_bias_, Scalar(0), ry_c);
      if (has_rx) {
        const matrix_type prx_c = chunk_patches(space, rx.data(), p0, p1, k, r_patches_, kept_r_);
        gemm(space, Trans::N, Trans::T, Scalar(1), prx_c, weight_, Scalar(1), ry_c);
      }
    });
  }

  /// After forward(), forward_r() and backward(dy, ·): adds R{d[W b]} to the bound product
  /// buffer and, unless rdx is empty, writes rdx = R{dx} (N x (C_in·H·W), contiguous); dy and
  /// rdy are N x (C_out·H_out·W_out), contiguous.
  /// @throws Error before forward() or bind_direction(); ShapeError on wrong extents.
  void backward_r(const execution_space &space, const matrix_type &dy, const matrix_type &rdy,
                  const matrix_type &rdx) override {
    ScopedRegion region("kat::nn::Conv2d::backward_r");
    const char *where = "kat::nn::Conv2d::backward_r";
    require_r_ready(where);
    const detail::Conv2dGeometry g = forward_geometry_;
    const std::size_t n = batch_;
    kat::detail::require_extent(where, "dy rows", n, dy.extent(0));
    kat::detail::require_extent(where, "dy columns", g.out_size(), dy.extent(1));
    require_contiguous(where, "dy", dy);
    kat::detail::require_extent(where, "rdy rows", n, rdy.extent(0));
    kat::detail::require_extent(where, "rdy columns", g.out_size(), rdy.extent(1));
    require_contiguous(where, "rdy", rdy);
    const bool want_rdx = rdx.extent(0) != 0;
    if (want_rdx) {
      kat::detail::require_extent(where, "rdx rows", n, rdx.extent(0));
      kat::detail::require_extent(where, "rdx columns", g.in_size(), rdx.extent(1));
      require_contiguous(where, "rdx", rdx);
    }
    if (n == 0) {
      return;
    }
    const bool has_rx = rx_.extent(0) != 0;
    const std::size_t positions = g.positions(), cols = weight_columns(), k = patch_size();
    const matrix_type dy_rows(dy.data(), n * positions, out_channels());
    const matrix_type rdy_rows(rdy.data(), n * positions, out_channels());
    const std::size_t step = full_ ? positions : chunk_positions(n, cols);
    if (!full_) {
      reserve_chunk(patches_, n, cols);
      if (has_rx) {
        reserve_chunk(r_patches_, n, k);
      }
      if (want_rdx) {
        reserve_chunk(dpatches_, n, cols);
      }
    }
    // First chunk first: backward() and forward_r() left its patch blocks in the workspaces.
    const std::size_t chunks = (positions + step - 1) / step;
    for (std::size_t c = 0; c < chunks; ++c) {
      const std::size_t p0 = c * step, p1 = std::min(positions, p0 + step);
      const auto rows = std::make_pair(n * p0, n * p1);
      const auto dy_c = Kokkos::subview(dy_rows, rows, Kokkos::ALL());
      const auto rdy_c = Kokkos::subview(rdy_rows, rows, Kokkos::ALL());
      const matrix_type p_c =
          full_ ? a_view_ : chunk_patches(space, x_.data(), p0, p1, cols, patches_, kept_);
      // R{d[W b]} += R{dY}ᵀ P (the ones column gives R{db} = Σ R{dY}), R{dW} += dYᵀ P(R{x}).
      gemm(space, Trans::T, Trans::N, Scalar(1), rdy_c, p_c, Scalar(1), hv_weight_bias_);
      if (has_rx) {
        const matrix_type prx_c = chunk_patches(space, rx_.data(), p0, p1, k, r_patches_, kept_r_);
        gemm(space, Trans::T, Trans::N, Scalar(1), dy_c, prx_c, Scalar(1), hv_weight_);
      }
      if (!want_rdx) {
        continue;
      }
      // R{dP} = R{dY} W + dY V, then col2im as in backward().
      const matrix_type dp_c = dpatches_.matrix(n * (p1 - p0), k);
      gemm(space, Trans::N, Trans::N, Scalar(1), rdy_c, weight_, Scalar(0), dp_c);
      gemm(space, Trans::N, Trans::N, Scalar(1), dy_c, v_weight_, Scalar(1), dp_c);
      col2im_chunk(space, dp_c, p0, p1, c == 0, rdx.data());
    }
  }
  /// @}

  /// (Re)allocations of the layer's workspaces so far; constant once the largest batch has
  /// been seen on each path.
  std::size_t workspace_allocations() const {
    return a_.allocations() + patches_.allocations() + dpatches_.allocations() +
           r_patches_.allocations();
  }

private:
  using bf16_operand = Bf16Operand<Scalar, MemorySpace>;

  // Which positions [p0, p1) of the last forward's batch a patch workspace holds (at data).
  struct KeptChunk {
    std::size_t p0 = 0, p1 = 0;
    const void *data = nullptr;
  };

  /// The chunked forward in bf16 (see the class comment): im2col rounds each chunk's patches
  /// into patches16_, [W b] is rounded once into weight16_, and the GEMM reads both.
  void forward_bf16(const execution_space &space, const Scalar *x, const matrix_type &y_rows) {
    const std::size_t n = batch_, positions = forward_geometry_.positions();
    const std::size_t cols = weight_columns(), step = chunk_positions(n, cols);
    weight16_.assign(space, weight_bias_);
    for (std::size_t p0 = 0; p0 < positions; p0 += step) {
      const std::size_t p1 = std::min(positions, p0 + step);
      const auto &p_c =
          fill_patches(space, x, p0, p1, cols, patches16_.resize(n * (p1 - p0), cols), kept16_);
      product_(space, Trans::N, Trans::T, Scalar(1), p_c, weight16_.matrix(), Scalar(0),
               Kokkos::subview(y_rows, std::make_pair(n * p0, n * p1), Kokkos::ALL()));
    }
  }

  /// The chunked backward in bf16: per chunk (last first, as the fp32 path), dY's rows rounded
  /// once into dy16_ for d[W b] (+)= dYᵀ P and dP = dY W; the patches rebuilt in bf16 unless
  /// patches16_ still holds them; W read from forward's weight16_ (its first K columns).
  void backward_bf16(const execution_space &space, const matrix_type &dy_rows, bool want_dw,
                     bool want_dx, bool accumulate, Scalar *dx) {
    const std::size_t n = batch_, positions = forward_geometry_.positions();
    const std::size_t cols = weight_columns(), k = patch_size();
    const std::size_t step = chunk_positions(n, cols);
    if (want_dx) {
      reserve_chunk(dpatches_, n, cols);
    }
    const typename bf16_operand::matrix_type w16(weight16_.matrix().data(), out_channels(), k);
    chunks_last_first(positions, step, [&](std::size_t p0, std::size_t p1, bool first) {
      dy16_.assign(space, Kokkos::subview(dy_rows, std::make_pair(n * p0, n * p1), Kokkos::ALL()));
      if (want_dw) {
        const auto &p_c = fill_patches(space, x_.data(), p0, p1, cols,
                                       patches16_.resize(n * (p1 - p0), cols), kept16_);
        product_(space, Trans::T, Trans::N, Scalar(1), dy16_.matrix(), p_c,
                 Scalar(accumulate || !first ? 1 : 0), grad_weight_bias_);
      }
      if (want_dx) {
        const matrix_type dp_c = dpatches_.matrix(n * (p1 - p0), k);
        product_(space, Trans::N, Trans::N, Scalar(1), dy16_.matrix(), w16, Scalar(0), dp_c);
        col2im_chunk(space, dp_c, p0, p1, first, dx);
      }
    });
  }

  std::size_t weight_columns() const { return patch_size() + (bias_ ? 1 : 0); }

  /// The last forward's problem, as kat/core/dnn.hpp describes it.
  Conv2dProblem dnn_problem() const {
    const detail::Conv2dGeometry &g = forward_geometry_;
    Conv2dProblem p;
    p.batch = batch_;
    p.in_channels = g.in_channels;
    p.height = g.height;
    p.width = g.width;
    p.out_channels = g.out_channels;
    p.out_height = g.out_height;
    p.out_width = g.out_width;
    p.kernel_h = g.kernel_h;
    p.kernel_w = g.kernel_w;
    p.stride_h = g.stride_h;
    p.stride_w = g.stride_w;
    p.pad_h = g.pad_h;
    p.pad_w = g.pad_w;
    p.dilation_h = g.dilation_h;
    p.dilation_w = g.dilation_w;
    p.bias = bias_;
    p.input_layout = forward_layouts_[0];
    p.output_layout = forward_layouts_[1];
    p.relu = forward_fused_;
    p.precision = this->precision_;
    return p;
  }

  static void require_contiguous(const char *where, const char *what, const matrix_type &m) {
    if (m.extent(1) > 1 && m.stride(1) != m.extent(0)) {
      throw ShapeError(kat::detail::concat(where, ": ", what,
                                           " must be contiguous, stride(1) must be ", m.extent(0),
                                           ", got ", m.stride(1)));
    }
  }

  void require_r_ready(const char *where) const {
    if (!forwarded_) {
      throw Error(kat::detail::concat(where, ": call forward() first"));
    }
    if (v_weight_bias_.extent(0) == 0) {
      throw Error(kat::detail::concat(where, ": no direction bound (bind_direction)"));
    }
    if (forward_layouts_[0] != ActivationLayout::features ||
        forward_layouts_[1] != ActivationLayout::features || forward_fused_) {
      throw Error(kat::detail::concat(
          where, ": the last forward() ran in oneDNN's layouts (", to_string(forward_layouts_[0]),
          " -> ", to_string(forward_layouts_[1]),
          ") or applied the following ReLU; run forward() again now that a direction is bound"));
    }
  }

  /// The patch block of `src` (x or R{x}, as the last forward's batch) for the positions
  /// [p0, p1), `cols` columns, in `ws`: built by im2col unless `kept` says ws still holds it,
  /// and recorded in `kept` (no kernel here: it runs in conv2d_im2col).
  matrix_type chunk_patches(const execution_space &space, const Scalar *src, std::size_t p0,
                            std::size_t p1, std::size_t cols, Workspace<Scalar, MemorySpace> &ws,
                            KeptChunk &kept) {
    return fill_patches(space, src, p0, p1, cols, ws.matrix(batch_ * (p1 - p0), cols), kept);
  }

  /// `p_c` (a patch block of Scalar or, for bf16 products, kat::bfloat16) holding the patches
  /// of `src` for the positions [p0, p1): written by im2col unless `kept` says p_c's storage
  /// holds them already, and recorded in `kept`.
  template <class Block>
  const Block &fill_patches(const execution_space &space, const Scalar *src, std::size_t p0,
                            std::size_t p1, std::size_t cols, const Block &p_c, KeptChunk &kept) {
    if (!(kept.p0 == p0 && kept.p1 == p1 && kept.data == p_c.data())) {
      ScopedRegion im2col_region("kat::nn::Conv2d::im2col");
      detail::conv2d_im2col(space, forward_geometry_, batch_, src, p0, p1, cols, p_c.data());
      kept = {p0, p1, p_c.data()};
    }
    return p_c;
  }

  /// Calls f(p0, p1, first) for the chunks [p0, p1) of `step` positions, last chunk first
  /// (forward() left its patch block in the workspace, and in cache, so it is not rebuilt);
  /// `first` is true for the first call.
  template <class F> static void chunks_last_first(std::size_t positions, std::size_t step, F &&f) {
    const std::size_t chunks = (positions + step - 1) / step;
    for (std::size_t c = chunks; c-- > 0;) {
      const std::size_t p0 = c * step;
      f(p0, std::min(positions, p0 + step), c + 1 == chunks);
    }
  }

  /// col2im of the patch gradients dp_c of the positions [p0, p1) into dx (the last forward's
  /// geometry and batch). The `first` chunk processed writes every dx element (zero where it
  /// does not reach); the others add, in the order processed, to the inputs their positions
  /// reach: one gather per output column of the chunk, over the tight band of inputs its
  /// windows cover.
  void col2im_chunk(const execution_space &space, const matrix_type &dp_c, std::size_t p0,
                    std::size_t p1, bool first, Scalar *dx) const {
    ScopedRegion col2im_region("kat::nn::Conv2d::col2im");
    const detail::Conv2dGeometry &g = forward_geometry_;
    const std::size_t n = batch_;
    if (first) {
      detail::conv2d_col2im(space, g, n, dp_c.data(), dp_c.extent(0), p0, p0, p1, dx, 0,
                            g.height - 1, 0, g.width - 1, true);
      return;
    }
    const std::size_t ho = static_cast<std::size_t>(g.out_height);
    for (std::size_t s0 = p0; s0 < p1; s0 = (s0 / ho + 1) * ho) {
      const std::size_t s1 = std::min(p1, (s0 / ho + 1) * ho);
      int ih_lo, ih_hi, iw_lo, iw_hi;
      column_band(g, s0, s1, ih_lo, ih_hi, iw_lo, iw_hi);
      if (ih_lo <= ih_hi && iw_lo <= iw_hi) {
        detail::conv2d_col2im(space, g, n, dp_c.data(), dp_c.extent(0), p0, s0, s1, dx, ih_lo,
                              ih_hi, iw_lo, iw_hi, false);
      }
    }
  }

  /// Output positions per chunk for a batch of n: the patch block n·positions·cols scalars is
  /// about chunk_bytes_, at least one position.
  std::size_t chunk_positions(std::size_t n, std::size_t cols) const {
    const std::size_t positions = forward_geometry_.positions();
    if (chunk_bytes_ == 0) {
      return positions;
    }
    const std::size_t per_position = n * cols * sizeof(Scalar);
    return std::clamp<std::size_t>(chunk_bytes_ / per_position, 1, positions);
  }

  /// Grows `ws` once to what any batch up to n needs, so a smaller last batch (which may fit
  /// more positions per chunk) does not reallocate.
  void reserve_chunk(Workspace<Scalar, MemorySpace> &ws, std::size_t n, std::size_t cols) const {
    const std::size_t whole = n * forward_geometry_.positions() * cols;
    const std::size_t budget =
        chunk_bytes_ == 0 ? whole : std::max(chunk_bytes_ / sizeof(Scalar), n * cols);
    ws.matrix(std::min(whole, budget), 1);
  }

  /// The input rows [ih_lo, ih_hi] and columns [iw_lo, iw_hi] that the windows of the output
  /// positions [s0, s1), all in one output column, reach (empty when lo > hi).
  static void column_band(const detail::Conv2dGeometry &g, std::size_t s0, std::size_t s1,
                          int &ih_lo, int &ih_hi, int &iw_lo, int &iw_hi) {
    const std::size_t ho = static_cast<std::size_t>(g.out_height);
    const int ow = static_cast<int>(s0 / ho);
    const int oh_lo = static_cast<int>(s0 % ho), oh_hi = static_cast<int>((s1 - 1) % ho);
    ih_lo = std::max(0, oh_lo * g.stride_h - g.pad_h);
    ih_hi = std::min(g.height - 1, oh_hi * g.stride_h - g.pad_h + (g.kernel_h - 1) * g.dilation_h);
    iw_lo = std::max(0, ow * g.stride_w - g.pad_w);
    iw_hi = std::min(g.width - 1, ow * g.stride_w - g.pad_w + (g.kernel_w - 1) * g.dilation_w);
  }

  bool bias_;
  std::size_t chunk_bytes_ = default_chunk_bytes;
  mutable detail::Conv2dGeometry geometry_; // hyperparameters + the shape output_shape() last saw
  detail::Conv2dGeometry forward_geometry_; // what the last forward() ran with
  std::size_t batch_ = 0;
  bool forwarded_ = false;
  bool full_ = false;          // whether the last forward built the whole P (recording)
  bool dnn_forwarded_ = false; // whether the last forward ran through the DNN library
  bool forward_fused_ = false; // whether it applied the following ReLU
  detail::FusedReluBackward<Scalar, MemorySpace> relu_{"kat::nn::Conv2d::relu_backward"};
  std::array<ActivationLayout, 2> forward_layouts_{ActivationLayout::features,
                                                   ActivationLayout::features};
  Conv2dBackend backend_ = Conv2dBackend::automatic;
  DnnIfAvailable<Conv2dDnn, execution_space, Scalar> dnn_;
  // The chunk [p0, p1) whose patch block patches_ holds (at data): what the last pass left
  // there, so the next one need not rebuild it.
  KeptChunk kept_;
  matrix_type weight_bias_, grad_weight_bias_, weight_, grad_weight_;
  vector_type bias_view_, grad_bias_;
  matrix_type x_;
  Workspace<Scalar, MemorySpace> a_{"kat::nn::Conv2d::a"};
  Workspace<Scalar, MemorySpace> patches_{"kat::nn::Conv2d::patches"};
  Workspace<Scalar, MemorySpace> dpatches_{"kat::nn::Conv2d::dpatches"};
  // forward() and backward()'s products on the im2col path in the layer's precision.
  MixedPrecisionGemm<Scalar, MemorySpace> product_;
  // The bf16 chunked path: [W b] rounded in forward, a chunk's patches (and which chunk, of
  // the last forward's batch), a chunk of dY rounded in backward.
  bf16_operand weight16_, patches16_, dy16_;
  KeptChunk kept16_;
  matrix_type a_view_, g_;
  // R-operator: the direction's and the product's blocks ([V v_b] and V; likewise for hv),
  // R{x} of the last forward_r (extent 0: zero) and its patch blocks.
  matrix_type v_weight_bias_, v_weight_, hv_weight_bias_, hv_weight_, rx_;
  Workspace<Scalar, MemorySpace> r_patches_{"kat::nn::Conv2d::r_patches"};
  KeptChunk kept_r_;
};

/// Sets `backend` (see Conv2d::set_backend) on every Conv2d among `layers` (a Sequential's
/// layers()) and, recursively, among their sublayers() (Residual's branches).
/// @return the number of Conv2d layers set.
/// @throws ValueError for Conv2dBackend::dnn where kat::dnn_available<ExecSpace, Scalar>() is
///         false, before any layer is changed.
template <class Scalar, class MemorySpace>
std::size_t
set_conv2d_backend(const std::vector<std::unique_ptr<Layer<Scalar, MemorySpace>>> &layers,
                   Conv2dBackend backend) {
  using execution_space = typename Layer<Scalar, MemorySpace>::execution_space;
  if (backend == Conv2dBackend::dnn && !dnn_available<execution_space, Scalar>()) {
    throw ValueError("kat::nn::set_conv2d_backend: backend dnn needs a vendor DNN library for "
                     "these layers (oneDNN, KAT_ENABLE_ONEDNN, float, host memory); "
                     "kat::dnn_available is false here");
  }
  std::size_t count = 0;
  std::vector<Layer<Scalar, MemorySpace> *> stack;
  for (const auto &layer : layers) {
    stack.push_back(layer.get());
  }
  while (!stack.empty()) {
    Layer<Scalar, MemorySpace> *layer = stack.back();
    stack.pop_back();
    if (auto *conv = dynamic_cast<Conv2d<Scalar, MemorySpace> *>(layer)) {
      conv->set_backend(backend);
      ++count;
    }
    for (auto *sub : layer->sublayers()) {
      stack.push_back(sub);
    }
  }
  return count;
}

} // namespace kat::nn
