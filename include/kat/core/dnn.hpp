#pragma once
/// @file
/// @brief KAT's entry point for vendor deep-learning primitives (convolutions), beside
/// kat/core/blas.hpp for dense products: oneDNN for host memory when KAT is configured with
/// KAT_ENABLE_ONEDNN; cuDNN and MIOpen would slot in behind the same class.
///
/// The layers keep their portable Kokkos implementations (Conv2d: im2col + GEMM) for every
/// space this dispatch does not serve, and for the passes that need their intermediate
/// matrices (K-FAC's patch matrix, the R-operator). `dnn_available<ExecSpace, Scalar>()`
/// says at compile time which case applies.

#include "kat/core/activation_layout.hpp"
#include "kat/core/detail/onednn_base.hpp"
#include "kat/core/error.hpp"
#include "kat/core/precision.hpp"
#include "kat/core/profiling.hpp"

#include <Kokkos_Core.hpp>

#include <chrono>
#include <cstddef>
#include <map>
#include <memory>
#include <string>
#include <type_traits>
#include <unordered_map>
#include <vector>

#if defined(KAT_ENABLE_ONEDNN)
#include <oneapi/dnnl/dnnl.hpp>
#endif

namespace kat {

/// Whether a vendor DNN library computes kernels on `ExecSpace` with `Scalar` in this build:
/// true for float on execution spaces whose memory the host can access (Serial, OpenMP,
/// Threads) when KAT is built with KAT_ENABLE_ONEDNN (oneDNN 2.x computes f32, not f64, on
/// CPUs). False everywhere else, where callers use their portable path.
template <class ExecSpace, class Scalar> constexpr bool dnn_available() {
#if defined(KAT_ENABLE_ONEDNN)
  return std::is_same<Scalar, float>::value &&
         Kokkos::SpaceAccessibility<Kokkos::HostSpace,
                                    typename ExecSpace::memory_space>::accessible;
#else
  return false;
#endif
}

/// One 2-D convolution problem (PyTorch's torch.nn.Conv2d with groups = 1, zero padding) on
/// a batch in KAT's layout: the input batch is N x (C_in·H·W) column-major with feature
/// index h + H (w + W c), so element (b, c, h, w) is at b + N (h + H (w + W c)); the output
/// likewise with (C_out, H_out, W_out); the weight is C_out x (C_in·k_h·k_w) column-major
/// with column i + k_h (j + k_w c) for kernel row i, kernel column j, input channel c; the
/// bias has C_out entries.
struct Conv2dProblem {
  /// N, the samples.
  std::size_t batch = 0;
  /// @{
  /// The input: C_in channels of H x W.
  int in_channels = 0, height = 0, width = 0;
  /// @}
  /// @{
  /// The output: C_out channels of H_out x W_out.
  int out_channels = 0, out_height = 0, out_width = 0;
  /// @}
  /// @{
  /// The kernel's rows k_h and columns k_w.
  int kernel_h = 1, kernel_w = 1;
  /// @}
  /// @{
  /// The vertical and horizontal stride.
  int stride_h = 1, stride_w = 1;
  /// @}
  /// @{
  /// The zero padding on each side, vertical and horizontal.
  int pad_h = 0, pad_w = 0;
  /// @}
  /// @{
  /// The vertical and horizontal dilation.
  int dilation_h = 1, dilation_w = 1;
  /// @}
  /// Whether a bias (C_out) is added.
  bool bias = true;
  /// Layout of x and dx (channels16 and channels16_bf16 need C_in a multiple of 16;
  /// channels_last takes any; channels_last_bf16 and channels16_bf16, with Precision::bf16
  /// only, hold x and dx as bf16).
  ActivationLayout input_layout = ActivationLayout::features;
  /// Layout of y and dy (as input_layout; in a layout that stores bf16 y and dy are bf16).
  ActivationLayout output_layout = ActivationLayout::features;
  /// y = max(0, conv(x) + b): a ReLU applied by the convolution (oneDNN's eltwise post-op).
  bool relu = false;
  /// Precision::bf16: x, the weights and dy enter the three passes as bf16 (rounded to nearest
  /// even), accumulation, dw and db stay fp32, y and dx too unless their layout stores bf16.
  Precision precision = Precision::fp32;

  /// Whether every field is equal (the same primitive serves both).
  bool operator==(const Conv2dProblem &o) const {
    return batch == o.batch && in_channels == o.in_channels && height == o.height &&
           width == o.width && out_channels == o.out_channels && out_height == o.out_height &&
           out_width == o.out_width && kernel_h == o.kernel_h && kernel_w == o.kernel_w &&
           stride_h == o.stride_h && stride_w == o.stride_w && pad_h == o.pad_h &&
           pad_w == o.pad_w && dilation_h == o.dilation_h && dilation_w == o.dilation_w &&
           bias == o.bias && input_layout == o.input_layout && output_layout == o.output_layout &&
           relu == o.relu && precision == o.precision;
  }
  /// Whether any field differs.
  bool operator!=(const Conv2dProblem &o) const { return !(*this == o); }
};

/// One batch normalization problem (training mode) for the DNN library: `batch` samples of
/// `channels` channels with `plane` = H·W values each, in `layout`.
struct BatchNormProblem {
  /// N, the samples.
  std::size_t batch = 0;
  /// @{
  /// C, the channels, and H·W, the values of a channel in one sample.
  int channels = 0, plane = 1;
  /// @}
  /// Whether γ and β are applied.
  bool affine = true;
  /// Added to the variance.
  double eps = 1e-5;
  /// Of x, y, dx and dy (in a layout that stores bf16 all four hold bf16; the statistics, γ,
  /// β and their gradients stay f32).
  ActivationLayout layout = ActivationLayout::channels16;
  /// y = max(0, BN(x)), backward masked accordingly (oneDNN's fuse_norm_relu).
  bool relu = false;

  /// Whether every field is equal (the same primitive serves both).
  bool operator==(const BatchNormProblem &o) const {
    return batch == o.batch && channels == o.channels && plane == o.plane && affine == o.affine &&
           eps == o.eps && layout == o.layout && relu == o.relu;
  }
};

/// One 2-D pooling problem (PyTorch's MaxPool2d / AvgPool2d with ceil_mode = false and, for
/// the average, count_include_pad = true) on a batch in `layout`.
struct Pool2dProblem {
  /// N, the samples.
  std::size_t batch = 0;
  /// @{
  /// C channels of H x W in, H_out x W_out out.
  int channels = 0, height = 0, width = 0, out_height = 0, out_width = 0;
  /// @}
  /// @{
  /// The window (rows, columns), its vertical and horizontal stride and the padding on each side.
  int kernel_h = 1, kernel_w = 1, stride_h = 1, stride_w = 1, pad_h = 0, pad_w = 0;
  /// @}
  bool max = true; ///< max pooling, else average over the whole window (padding counted)
  /// Of x, y, dx and dy (in a layout that stores bf16 all four hold bf16; averages are
  /// computed in fp32 and rounded once).
  ActivationLayout layout = ActivationLayout::channels16;

  /// Whether every field is equal (the same primitive serves both).
  bool operator==(const Pool2dProblem &o) const {
    return batch == o.batch && channels == o.channels && height == o.height && width == o.width &&
           out_height == o.out_height && out_width == o.out_width && kernel_h == o.kernel_h &&
           kernel_w == o.kernel_w && stride_h == o.stride_h && stride_w == o.stride_w &&
           pad_h == o.pad_h && pad_w == o.pad_w && max == o.max && layout == o.layout;
  }
};

/// The layout conversions ("reorders") a vendor library needed between KAT's layouts and its
/// own (blocked) ones: how many, how many bytes they read, and their wall time.
struct DnnReorderStats {
  /// Conversions run.
  std::size_t reorders = 0;
  /// Bytes they read.
  std::size_t bytes = 0;
  /// Their wall time (s).
  double seconds = 0;
};

namespace detail {

#if defined(KAT_ENABLE_ONEDNN)

/// A oneDNN f32 memory descriptor for KAT's batch layout of (N, C, H, W): element
/// (b, c, h, w) at b + N (h + H (w + W c)).
inline dnnl::memory::desc onednn_batch_desc(std::size_t n, int c, int h, int w) {
  using dim = dnnl::memory::dim;
  const dim dn = static_cast<dim>(n), dh = h, dw = w;
  return dnnl::memory::desc({dn, c, dh, dw}, dnnl::memory::data_type::f32,
                            dnnl::memory::dims{1, dn * dh * dw, dn, dn * dh});
}

/// The data type of the values a batch in `layout` holds: bf16 for channels_last_bf16 and
/// channels16_bf16, f32 for the others.
inline dnnl::memory::data_type onednn_activation_type(ActivationLayout layout) {
  return layout_stores_bf16(layout) ? dnnl::memory::data_type::bf16 : dnnl::memory::data_type::f32;
}

/// The descriptor of an (N, C, H, W) batch in `layout` (f32, or bf16 for the layouts that
/// store bf16).
inline dnnl::memory::desc onednn_activation_desc(ActivationLayout layout, std::size_t n, int c,
                                                 int h, int w) {
  if (layout == ActivationLayout::features) {
    return onednn_batch_desc(n, c, h, w);
  }
  return dnnl::memory::desc(
      {static_cast<dnnl::memory::dim>(n), c, h, w}, onednn_activation_type(layout),
      layout_blocks16(layout) ? dnnl::memory::format_tag::nChw16c : dnnl::memory::format_tag::nhwc);
}

/// ... and for KAT's weight layout: W(o, i + k_h (j + k_w c)) column-major, C_out rows.
inline dnnl::memory::desc onednn_weight_desc(int out, int in, int kh, int kw) {
  using dim = dnnl::memory::dim;
  const dim o = out, h = kh, w = kw;
  return dnnl::memory::desc({o, in, h, w}, dnnl::memory::data_type::f32,
                            dnnl::memory::dims{1, o * h * w, o, o * h});
}

/// A oneDNN memory over a KAT buffer (no copy).
inline dnnl::memory onednn_wrap(const dnnl::memory::desc &desc, const float *data) {
  return dnnl::memory(desc, onednn_engine(), const_cast<float *>(data));
}

/// Attributes that make a primitive add to its destination (post-op sum, scale 1).
inline dnnl::primitive_attr onednn_accumulate_attr() {
  dnnl::post_ops ops;
  ops.append_sum(1.0f);
  dnnl::primitive_attr attr;
  attr.set_post_ops(ops);
  return attr;
}

/// A memory in the layout a primitive chose, with a reorder from (or to) KAT's layout when
/// the two differ, and whether it currently holds a given source. An output that adds to KAT's
/// buffer (`accumulate_outbound`) is always staged: the primitive writes the staged copy and
/// the reorder out adds it.
struct OnednnStaged {
  dnnl::memory::desc kat_desc;  // KAT's layout
  dnnl::memory::desc want_desc; // the primitive's
  dnnl::memory staged;          // in want_desc when it differs from kat_desc
  dnnl::reorder to_staged, from_staged;
  bool in_kat_layout = true;
  const void *holds = nullptr; // the KAT buffer staged currently mirrors

  OnednnStaged() = default;
  OnednnStaged(const dnnl::memory::desc &kat, const dnnl::memory::desc &want, bool inbound,
               bool outbound, bool accumulate_outbound = false)
      : kat_desc(kat), want_desc(want), in_kat_layout(kat == want && !accumulate_outbound) {
    const dnnl::engine &eng = onednn_engine();
    if (in_kat_layout) {
      return;
    }
    staged = dnnl::memory(want, eng);
    if (inbound) {
      to_staged = dnnl::reorder(dnnl::reorder::primitive_desc(eng, kat, eng, want));
    }
    if (outbound) {
      const dnnl::primitive_attr attr =
          accumulate_outbound ? onednn_accumulate_attr() : dnnl::primitive_attr();
      from_staged = dnnl::reorder(dnnl::reorder::primitive_desc(eng, want, eng, kat, attr));
    }
  }
};

/// Counts and times one reorder.
inline void onednn_run_reorder(const char *region_name, dnnl::stream &stream, dnnl::reorder &r,
                               dnnl::memory &from, dnnl::memory &to, DnnReorderStats &stats) {
  ScopedRegion region(region_name);
  const auto t0 = std::chrono::steady_clock::now();
  r.execute(stream, from, to);
  stream.wait();
  stats.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  stats.reorders += 1;
  stats.bytes += from.get_desc().get_size();
}

/// oneDNN's three convolution primitives for one Conv2dProblem, their staged operands and
/// the memories wrapping KAT's buffers (rebound to new pointers on every call).
///
/// The primitives choose their own activation layouts (format_tag::any), and OnednnStaged
/// reorders KAT's batches into them, except in fp32 where a side of the problem is
/// channels_last (the f32 layout below AVX-512, dnn_f32_layout()): there x, y, dx and dy are
/// given to all three passes as nhwc, provided oneDNN serves every pass in it with a kernel of
/// its own (not "ref"). oneDNN 2.6 would otherwise compute in nChw8c on AVX2, which costs two
/// reorders per pass and, for C_in below the block of 8, pads the input eight-fold in the
/// weight gradient: the CNN's first convolution (1 -> 32, 5x5, batch 128) took 12.4 ms
/// forward + backward that way against 4.2 ms in nhwc on Zen 3 (BM_Conv2dBackends,
/// docs/benchmarks.md).
class OnednnConv2dPlan {
public:
  explicit OnednnConv2dPlan(const Conv2dProblem &p) : problem_(p), stream_(onednn_engine()) {
    using namespace dnnl;
    const engine &eng = onednn_engine();
    const bool channels_last = p.input_layout == ActivationLayout::channels_last ||
                               p.output_layout == ActivationLayout::channels_last;
    if (!(p.precision == Precision::fp32 && channels_last && nhwc_served())) {
      create_primitive_descs(memory::format_tag::any);
    }
    fwd_ = convolution_forward(fwd_pd_);
    bwd_data_ = convolution_backward_data(bwd_data_pd_);
    bwd_weights_ = convolution_backward_weights(bwd_weights_pd_);

    const memory::desc x_kat =
        onednn_activation_desc(p.input_layout, p.batch, p.in_channels, p.height, p.width);
    const memory::desc y_kat =
        onednn_activation_desc(p.output_layout, p.batch, p.out_channels, p.out_height, p.out_width);
    const memory::desc w_kat =
        onednn_weight_desc(p.out_channels, p.in_channels, p.kernel_h, p.kernel_w);
    x_fwd_ = OnednnStaged(x_kat, fwd_pd_.src_desc(), true, false);
    w_fwd_ = OnednnStaged(w_kat, fwd_pd_.weights_desc(), true, false);
    y_fwd_ = OnednnStaged(y_kat, fwd_pd_.dst_desc(), false, true);
    x_bwd_ = OnednnStaged(x_kat, bwd_weights_pd_.src_desc(), true, false);
    if (!x_fwd_.in_kat_layout && x_bwd_.want_desc == x_fwd_.want_desc) {
      x_bwd_.staged = x_fwd_.staged; // one buffer: forward() stages x for both
    }
    dy_bwd_w_ = OnednnStaged(y_kat, bwd_weights_pd_.diff_dst_desc(), true, false);
    dy_bwd_d_ = OnednnStaged(y_kat, bwd_data_pd_.diff_dst_desc(), true, false);
    w_bwd_ = OnednnStaged(w_kat, bwd_data_pd_.weights_desc(), true, false);
    dx_bwd_ = OnednnStaged(x_kat, bwd_data_pd_.diff_src_desc(), false, true);
    dw_set_ = OnednnStaged(w_kat, bwd_weights_pd_.diff_weights_desc(), false, true, false);
    dw_add_ = OnednnStaged(w_kat, bwd_weights_pd_.diff_weights_desc(), false, true, true);
    if (p.bias) {
      const memory::desc b_desc = bias_desc();
      db_staged_ = memory(b_desc, eng);
      db_add_ =
          reorder(reorder::primitive_desc(eng, b_desc, eng, b_desc, onednn_accumulate_attr()));
    }
  }

  const Conv2dProblem &problem() const { return problem_; }

  /// Which implementation oneDNN chose for each pass (e.g. "jit:avx512_core").
  std::string implementations() const {
    return std::string("forward ") + fwd_pd_.impl_info_str() + ", backward data " +
           bwd_data_pd_.impl_info_str() + ", backward weights " + bwd_weights_pd_.impl_info_str();
  }

  void forward(const float *x, const float *w, const float *b, float *y, DnnReorderStats &stats) {
    using namespace dnnl;
    // The buffers are the same from step to step but their contents are not: nothing staged
    // before this call is current.
    for (OnednnStaged *s : {&x_fwd_, &w_fwd_, &x_bwd_, &dy_bwd_w_, &dy_bwd_d_, &w_bwd_}) {
      s->holds = nullptr;
    }
    memory x_mem = stage_in(x_fwd_, x, stats);
    memory w_mem = stage_in(w_fwd_, w, stats);
    memory y_mem = y_fwd_.in_kat_layout ? onednn_wrap(y_fwd_.kat_desc, y) : y_fwd_.staged;
    {
      ScopedRegion region("kat::dnn::conv2d_forward");
      std::unordered_map<int, memory> args{
          {DNNL_ARG_SRC, x_mem}, {DNNL_ARG_WEIGHTS, w_mem}, {DNNL_ARG_DST, y_mem}};
      if (problem_.bias) {
        args.insert({DNNL_ARG_BIAS, onednn_wrap(fwd_pd_.bias_desc(), b)});
      }
      fwd_.execute(stream_, args);
      stream_.wait();
    }
    stage_out(y_fwd_, y, stats);
    // The backward-weights pass reads x in its own layout: the forward's copy serves when the
    // layouts agree (x must not change before backward(), as for every layer).
    if (!x_fwd_.in_kat_layout && x_bwd_.want_desc == x_fwd_.want_desc) {
      x_bwd_.holds = x; // the same buffer (see the constructor)
    }
  }

  /// dx = conv_transpose(dy, w) when dx is not null; dw (+)= dyᵀ ⋆ x and db (+)= Σ dy when
  /// dw is not null, with x the input of the last forward().
  void backward(const float *x, const float *dy, const float *w, float *dx, float *dw, float *db,
                bool accumulate, DnnReorderStats &stats) {
    using namespace dnnl;
    dy_bwd_w_.holds = nullptr;
    dy_bwd_d_.holds = nullptr;
    if (dw != nullptr) {
      memory x_mem = stage_in(x_bwd_, x, stats);
      memory dy_mem = stage_in(dy_bwd_w_, dy, stats);
      OnednnStaged &dw_target = accumulate ? dw_add_ : dw_set_;
      memory dw_mem =
          dw_target.in_kat_layout ? onednn_wrap(dw_target.kat_desc, dw) : dw_target.staged;
      {
        ScopedRegion region("kat::dnn::conv2d_backward_weights");
        std::unordered_map<int, memory> args{
            {DNNL_ARG_SRC, x_mem}, {DNNL_ARG_DIFF_DST, dy_mem}, {DNNL_ARG_DIFF_WEIGHTS, dw_mem}};
        if (problem_.bias) {
          args.insert({DNNL_ARG_DIFF_BIAS,
                       accumulate ? db_staged_ : onednn_wrap(db_staged_.get_desc(), db)});
        }
        bwd_weights_.execute(stream_, args);
        stream_.wait();
      }
      stage_out(dw_target, dw, stats);
      if (problem_.bias && accumulate) {
        memory db_mem = onednn_wrap(db_staged_.get_desc(), db);
        db_add_.execute(stream_, db_staged_, db_mem);
        stream_.wait();
      }
    }
    if (dx != nullptr) {
      memory dy_mem;
      if (dw != nullptr && !dy_bwd_w_.in_kat_layout && dy_bwd_d_.want_desc == dy_bwd_w_.want_desc) {
        dy_mem = dy_bwd_w_.staged; // staged for the weights pass above
      } else {
        dy_mem = stage_in(dy_bwd_d_, dy, stats);
      }
      // The weights are staged again (they are small): the caller may have changed them since
      // forward().
      w_bwd_.holds = nullptr;
      memory w_mem = stage_in(w_bwd_, w, stats);
      memory dx_mem = dx_bwd_.in_kat_layout ? onednn_wrap(dx_bwd_.kat_desc, dx) : dx_bwd_.staged;
      {
        ScopedRegion region("kat::dnn::conv2d_backward_data");
        bwd_data_.execute(
            stream_,
            {{DNNL_ARG_DIFF_DST, dy_mem}, {DNNL_ARG_WEIGHTS, w_mem}, {DNNL_ARG_DIFF_SRC, dx_mem}});
        stream_.wait();
      }
      stage_out(dx_bwd_, dx, stats);
    }
  }

private:
  /// The bias and its gradient: C_out f32 values.
  dnnl::memory::desc bias_desc() const {
    return dnnl::memory::desc({problem_.out_channels}, dnnl::memory::data_type::f32,
                              dnnl::memory::format_tag::a);
  }

  /// The three primitive descriptors with the activations (x, y, dx, dy) in `activations`
  /// (format_tag::any: oneDNN's choice) and the weights in oneDNN's choice.
  void create_primitive_descs(dnnl::memory::format_tag activations) {
    using namespace dnnl;
    const Conv2dProblem &p = problem_;
    const engine &eng = onednn_engine();
    const memory::desc b_desc = bias_desc();
    const memory::dims x_dims{static_cast<memory::dim>(p.batch), p.in_channels, p.height, p.width};
    const memory::dims y_dims{static_cast<memory::dim>(p.batch), p.out_channels, p.out_height,
                              p.out_width};
    const memory::dims w_dims{p.out_channels, p.in_channels, p.kernel_h, p.kernel_w};
    const auto any = memory::format_tag::any;
    // In bf16 the operands of the products (x, w, dy) are bf16; what the passes write (y, dx,
    // dw, db) and their accumulation stay f32, except y and dx in a layout that stores bf16
    // (the next layer reads bf16, so oneDNN rounds them itself).
    const auto in_type =
        p.precision == Precision::bf16 ? memory::data_type::bf16 : memory::data_type::f32;
    const memory::desc x_desc(x_dims, in_type, activations);
    const memory::desc y_desc(y_dims, onednn_activation_type(p.output_layout), activations);
    const memory::desc w_desc(w_dims, in_type, any);
    const memory::desc dx_desc(x_dims, onednn_activation_type(p.input_layout), activations);
    const memory::desc dy_desc(y_dims, in_type, activations);
    const memory::desc dw_desc(w_dims, memory::data_type::f32, any);
    const memory::dims strides{p.stride_h, p.stride_w};
    // oneDNN counts dilation from 0 (no gaps), PyTorch from 1.
    const memory::dims dilates{p.dilation_h - 1, p.dilation_w - 1};
    const memory::dims pad_l{p.pad_h, p.pad_w};
    // oneDNN wants the right/bottom padding that makes its output size H_out: the rows the
    // last window reaches past the input, which may be less than pad_h when the stride
    // leaves input rows unused.
    const memory::dims pad_r{
        (p.out_height - 1) * p.stride_h + (p.kernel_h - 1) * p.dilation_h + 1 - p.height - p.pad_h,
        (p.out_width - 1) * p.stride_w + (p.kernel_w - 1) * p.dilation_w + 1 - p.width - p.pad_w};
    const auto alg = algorithm::convolution_direct;
    auto fwd_desc =
        p.bias ? convolution_forward::desc(prop_kind::forward_training, alg, x_desc, w_desc, b_desc,
                                           y_desc, strides, dilates, pad_l, pad_r)
               : convolution_forward::desc(prop_kind::forward_training, alg, x_desc, w_desc, y_desc,
                                           strides, dilates, pad_l, pad_r);
    primitive_attr fwd_attr;
    if (p.relu) {
      post_ops ops;
      ops.append_eltwise(1.0f, algorithm::eltwise_relu, 0.0f, 0.0f);
      fwd_attr.set_post_ops(ops);
    }
    fwd_pd_ = convolution_forward::primitive_desc(fwd_desc, fwd_attr, eng);
    bwd_data_pd_ = convolution_backward_data::primitive_desc(
        convolution_backward_data::desc(alg, dx_desc, w_desc, dy_desc, strides, dilates, pad_l,
                                        pad_r),
        eng, fwd_pd_);
    auto bwd_w_desc =
        p.bias ? convolution_backward_weights::desc(alg, x_desc, dw_desc, b_desc, dy_desc, strides,
                                                    dilates, pad_l, pad_r)
               : convolution_backward_weights::desc(alg, x_desc, dw_desc, dy_desc, strides, dilates,
                                                    pad_l, pad_r);
    bwd_weights_pd_ = convolution_backward_weights::primitive_desc(bwd_w_desc, eng, fwd_pd_);
  }

  /// create_primitive_descs(nhwc), and whether oneDNN serves every pass in it with a kernel
  /// of its own: false where it refuses the problem in nhwc or has only a reference one.
  bool nhwc_served() {
    try {
      create_primitive_descs(dnnl::memory::format_tag::nhwc);
    } catch (const dnnl::error &) {
      return false;
    }
    const auto reference = [](const char *impl) { return std::string(impl).rfind("ref", 0) == 0; };
    return !reference(fwd_pd_.impl_info_str()) && !reference(bwd_data_pd_.impl_info_str()) &&
           !reference(bwd_weights_pd_.impl_info_str());
  }

  /// The operand `data` (in KAT's layout) as the primitive wants it: wrapped when the layouts
  /// agree, otherwise reordered into the staged buffer unless it already mirrors `data`
  /// (within one forward/backward; forward() and backward() forget what was staged before).
  dnnl::memory stage_in(OnednnStaged &s, const float *data, DnnReorderStats &stats) {
    if (s.in_kat_layout) {
      return onednn_wrap(s.kat_desc, data);
    }
    if (s.holds != data) {
      dnnl::memory src = onednn_wrap(s.kat_desc, data);
      onednn_run_reorder("kat::dnn::reorder_in", stream_, s.to_staged, src, s.staged, stats);
      s.holds = data;
    }
    return s.staged;
  }

  void stage_out(OnednnStaged &s, float *data, DnnReorderStats &stats) {
    if (s.in_kat_layout) {
      return;
    }
    dnnl::memory dst = onednn_wrap(s.kat_desc, data);
    onednn_run_reorder("kat::dnn::reorder_out", stream_, s.from_staged, s.staged, dst, stats);
  }

  Conv2dProblem problem_;
  dnnl::stream stream_;
  dnnl::convolution_forward::primitive_desc fwd_pd_;
  dnnl::convolution_backward_data::primitive_desc bwd_data_pd_;
  dnnl::convolution_backward_weights::primitive_desc bwd_weights_pd_;
  dnnl::convolution_forward fwd_;
  dnnl::convolution_backward_data bwd_data_;
  dnnl::convolution_backward_weights bwd_weights_;
  OnednnStaged x_fwd_, w_fwd_, y_fwd_, x_bwd_, dy_bwd_w_, dy_bwd_d_, w_bwd_, dx_bwd_, dw_set_,
      dw_add_;
  dnnl::memory db_staged_;
  dnnl::reorder db_add_;
};

/// oneDNN's batch normalization (training forward and backward) for one BatchNormProblem,
/// with the batch mean and (biased) variance it computes kept for the backward pass.
class OnednnBatchNormPlan {
public:
  explicit OnednnBatchNormPlan(const BatchNormProblem &p) : problem_(p), stream_(onednn_engine()) {
    using namespace dnnl;
    const engine &eng = onednn_engine();
    data_ = onednn_activation_desc(p.layout, p.batch, p.channels, p.plane, 1);
    auto flags = p.affine ? normalization_flags::use_scale_shift : normalization_flags::none;
    if (p.relu) {
      flags = flags | normalization_flags::fuse_norm_relu;
    }
    const float eps = static_cast<float>(p.eps);
    fwd_pd_ = batch_normalization_forward::primitive_desc(
        batch_normalization_forward::desc(prop_kind::forward_training, data_, eps, flags), eng);
    bwd_pd_ = batch_normalization_backward::primitive_desc(
        batch_normalization_backward::desc(
            p.affine ? prop_kind::backward : prop_kind::backward_data, data_, data_, eps, flags),
        eng, fwd_pd_);
    fwd_ = batch_normalization_forward(fwd_pd_);
    bwd_ = batch_normalization_backward(bwd_pd_);
    mean_ = memory(fwd_pd_.mean_desc(), eng);
    variance_ = memory(fwd_pd_.variance_desc(), eng);
    if (p.affine) {
      diff_scale_shift_ = memory(bwd_pd_.diff_weights_desc(), eng);
    }
    if (p.relu) { // the ReLU's mask, written by forward and read by backward
      workspace_ = memory(fwd_pd_.workspace_desc(), eng);
    }
  }

  const BatchNormProblem &problem() const { return problem_; }
  std::string implementations() const {
    return std::string("forward ") + fwd_pd_.impl_info_str() + ", backward " +
           bwd_pd_.impl_info_str();
  }
  const float *mean() const { return static_cast<const float *>(mean_.get_data_handle()); }
  const float *variance() const { return static_cast<const float *>(variance_.get_data_handle()); }
  /// dγ then dβ (2·channels floats) of the last backward().
  const float *diff_scale_shift() const {
    return static_cast<const float *>(diff_scale_shift_.get_data_handle());
  }

  void forward(const float *x, const float *scale_shift, float *y) {
    using namespace dnnl;
    ScopedRegion region("kat::dnn::batch_norm_forward");
    std::unordered_map<int, memory> args{{DNNL_ARG_SRC, onednn_wrap(data_, x)},
                                         {DNNL_ARG_DST, onednn_wrap(data_, y)},
                                         {DNNL_ARG_MEAN, mean_},
                                         {DNNL_ARG_VARIANCE, variance_}};
    if (problem_.affine) {
      args.insert({DNNL_ARG_SCALE_SHIFT, onednn_wrap(fwd_pd_.weights_desc(), scale_shift)});
    }
    if (problem_.relu) {
      args.insert({DNNL_ARG_WORKSPACE, workspace_});
    }
    fwd_.execute(stream_, args);
    stream_.wait();
  }

  void backward(const float *x, const float *dy, const float *scale_shift, float *dx) {
    using namespace dnnl;
    ScopedRegion region("kat::dnn::batch_norm_backward");
    std::unordered_map<int, memory> args{{DNNL_ARG_SRC, onednn_wrap(data_, x)},
                                         {DNNL_ARG_DIFF_DST, onednn_wrap(data_, dy)},
                                         {DNNL_ARG_MEAN, mean_},
                                         {DNNL_ARG_VARIANCE, variance_},
                                         {DNNL_ARG_DIFF_SRC, onednn_wrap(data_, dx)}};
    if (problem_.affine) {
      args.insert({DNNL_ARG_SCALE_SHIFT, onednn_wrap(bwd_pd_.weights_desc(), scale_shift)});
      args.insert({DNNL_ARG_DIFF_SCALE_SHIFT, diff_scale_shift_});
    }
    if (problem_.relu) {
      args.insert({DNNL_ARG_WORKSPACE, workspace_});
    }
    bwd_.execute(stream_, args);
    stream_.wait();
  }

private:
  BatchNormProblem problem_;
  dnnl::stream stream_;
  dnnl::memory::desc data_;
  dnnl::batch_normalization_forward::primitive_desc fwd_pd_;
  dnnl::batch_normalization_backward::primitive_desc bwd_pd_;
  dnnl::batch_normalization_forward fwd_;
  dnnl::batch_normalization_backward bwd_;
  dnnl::memory mean_, variance_, diff_scale_shift_, workspace_;
};

/// oneDNN's pooling (training forward, backward) for one Pool2dProblem; for max pooling the
/// forward records each window's argmax in a workspace the backward reads.
class OnednnPool2dPlan {
public:
  explicit OnednnPool2dPlan(const Pool2dProblem &p) : problem_(p), stream_(onednn_engine()) {
    using namespace dnnl;
    const engine &eng = onednn_engine();
    src_ = onednn_activation_desc(p.layout, p.batch, p.channels, p.height, p.width);
    dst_ = onednn_activation_desc(p.layout, p.batch, p.channels, p.out_height, p.out_width);
    const auto alg = p.max ? algorithm::pooling_max : algorithm::pooling_avg_include_padding;
    const memory::dims kernel{p.kernel_h, p.kernel_w}, strides{p.stride_h, p.stride_w};
    const memory::dims pad_l{p.pad_h, p.pad_w}, dilation{0, 0};
    // As for convolutions: the bottom/right padding that gives PyTorch's output size.
    const memory::dims pad_r{(p.out_height - 1) * p.stride_h + p.kernel_h - p.height - p.pad_h,
                             (p.out_width - 1) * p.stride_w + p.kernel_w - p.width - p.pad_w};
    fwd_pd_ = pooling_v2_forward::primitive_desc(
        pooling_v2_forward::desc(prop_kind::forward_training, alg, src_, dst_, strides, kernel,
                                 dilation, pad_l, pad_r),
        eng);
    bwd_pd_ = pooling_v2_backward::primitive_desc(
        pooling_v2_backward::desc(alg, src_, dst_, strides, kernel, dilation, pad_l, pad_r), eng,
        fwd_pd_);
    fwd_ = pooling_v2_forward(fwd_pd_);
    bwd_ = pooling_v2_backward(bwd_pd_);
    if (fwd_pd_.workspace_desc().get_size() != 0) {
      workspace_ = memory(fwd_pd_.workspace_desc(), eng);
    }
  }

  const Pool2dProblem &problem() const { return problem_; }
  std::string implementations() const {
    return std::string("forward ") + fwd_pd_.impl_info_str() + ", backward " +
           bwd_pd_.impl_info_str();
  }

  void forward(const float *x, float *y) {
    ScopedRegion region("kat::dnn::pool2d_forward");
    std::unordered_map<int, dnnl::memory> args{{DNNL_ARG_SRC, onednn_wrap(src_, x)},
                                               {DNNL_ARG_DST, onednn_wrap(dst_, y)}};
    if (workspace_) {
      args.insert({DNNL_ARG_WORKSPACE, workspace_});
    }
    fwd_.execute(stream_, args);
    stream_.wait();
  }

  void backward(const float *dy, float *dx) {
    ScopedRegion region("kat::dnn::pool2d_backward");
    std::unordered_map<int, dnnl::memory> args{{DNNL_ARG_DIFF_DST, onednn_wrap(dst_, dy)},
                                               {DNNL_ARG_DIFF_SRC, onednn_wrap(src_, dx)}};
    if (workspace_) {
      args.insert({DNNL_ARG_WORKSPACE, workspace_});
    }
    bwd_.execute(stream_, args);
    stream_.wait();
  }

private:
  Pool2dProblem problem_;
  dnnl::stream stream_;
  dnnl::memory::desc src_, dst_;
  dnnl::pooling_v2_forward::primitive_desc fwd_pd_;
  dnnl::pooling_v2_backward::primitive_desc bwd_pd_;
  dnnl::pooling_v2_forward fwd_;
  dnnl::pooling_v2_backward bwd_;
  dnnl::memory workspace_;
};

/// Runs f, turning a oneDNN error into kat::Error("<who>::<pass>: oneDNN failed for <what>:
/// <oneDNN's message>").
template <class F>
void onednn_guarded(const char *who, const char *pass, const std::string &what, F &&f) {
  try {
    f();
  } catch (const dnnl::error &e) {
    throw Error(kat::detail::concat(who, "::", pass, ": oneDNN failed for ", what, ": ", e.what()));
  }
}

/// Whether oneDNN, left to choose (format_tag::any), computes a ResNet-sized 3x3 convolution
/// (64 x 32 x 14 x 14, padding 1) with `type` operands and output in nChw16c on this CPU;
/// false where it has no such convolution.
inline bool onednn_convolution_picks_nchw16c(dnnl::memory::data_type type) {
  using namespace dnnl;
  const memory::dims x{64, 32, 14, 14}, w{32, 32, 3, 3}, one{1, 1}, pad{1, 1};
  const auto any = memory::format_tag::any;
  const memory::desc x_desc(x, type, any), w_desc(w, type, any);
  try {
    const convolution_forward::primitive_desc pd(
        convolution_forward::desc(prop_kind::forward_training, algorithm::convolution_direct,
                                  x_desc, w_desc, x_desc, one, pad, pad),
        onednn_engine());
    return pd.src_desc() == memory::desc(x, type, memory::format_tag::nChw16c);
  } catch (const dnnl::error &) {
    return false;
  }
}

#endif // KAT_ENABLE_ONEDNN

/// Whether the DNN library computes bf16 convolutions (bf16 x, weights and dy; f32 y, dx, dw)
/// on this CPU, natively or emulated: found once per process by creating the primitive of a
/// small channels-last problem (oneDNN 2.x has none below AVX-512). Always false without
/// oneDNN. Layers offer ActivationLayout::channels_last in Precision::bf16 only where this
/// holds, since no other path of theirs reads that layout. It stands for oneDNN's bf16
/// pooling and batch normalization too (dnn_reads_layout()), which need the same AVX-512.
inline bool dnn_bf16_convolutions() {
#if defined(KAT_ENABLE_ONEDNN)
  static const bool available = [] {
    using namespace dnnl;
    const memory::dims x{1, 16, 4, 4}, w{16, 16, 3, 3}, one{1, 1};
    const memory::desc x_desc(x, memory::data_type::bf16, memory::format_tag::nhwc);
    const memory::desc y_desc(x, memory::data_type::f32, memory::format_tag::nhwc);
    const memory::desc w_desc(w, memory::data_type::bf16, memory::format_tag::any);
    try {
      const convolution_forward::primitive_desc pd(
          convolution_forward::desc(prop_kind::forward_training, algorithm::convolution_direct,
                                    x_desc, w_desc, y_desc, one, {0, 0}, one, one),
          onednn_engine());
      return true;
    } catch (const dnnl::error &) {
      return false;
    }
  }();
  return available;
#else
  return false;
#endif
}

/// Whether the DNN library's f32 convolutions compute in nChw16c on this CPU (oneDNN's AVX-512
/// kernels) rather than in nChw8c (its AVX2 kernels): the layout oneDNN picks for the input of
/// a ResNet-sized problem left to it (format_tag::any), found once per process. Where it does
/// not, oneDNN has only reference kernels for nChw16c (on an AVX2-only AMD Zen 3 they made a
/// CNN epoch 188 s), so Conv2d's fp32 DNN path computes in channels_last there, for which
/// oneDNN has AVX2 kernels, instead of channels16. False without oneDNN.
inline bool dnn_f32_blocked() {
#if defined(KAT_ENABLE_ONEDNN)
  static const bool blocked = onednn_convolution_picks_nchw16c(dnnl::memory::data_type::f32);
  return blocked;
#else
  return false;
#endif
}

/// The layout Conv2d's fp32 DNN path computes in on this CPU: ActivationLayout::channels16
/// where oneDNN's f32 convolutions compute in nChw16c (dnn_f32_blocked(): AVX-512), else
/// channels_last.
inline ActivationLayout dnn_f32_layout() {
  return dnn_f32_blocked() ? ActivationLayout::channels16 : ActivationLayout::channels_last;
}

/// Whether the DNN library's primitives read and write `layout` on this CPU with kernels of
/// their own: every layout of Scalar values but channels16, which needs oneDNN's AVX-512
/// kernels (dnn_f32_blocked(); below AVX-512 it has only reference kernels there); a layout
/// that stores bf16 values (channels_last_bf16, channels16_bf16) only where
/// dnn_bf16_convolutions() holds (oneDNN 2.x has no bf16 primitive below AVX-512, and forward()
/// would fail). Pooling and batch normalization offer their oneDNN layouts only where this holds.
inline bool dnn_reads_layout(ActivationLayout layout) {
  return (!layout_stores_bf16(layout) || dnn_bf16_convolutions()) &&
         (layout != ActivationLayout::channels16 || dnn_f32_blocked());
}

/// Whether the DNN library's bf16 convolutions compute in nChw16c on this CPU (oneDNN's
/// AVX512-BF16 kernels without AMX, e.g. AMD's Zen 4) rather than channels last (its AMX
/// kernels, Intel Sapphire Rapids on): the layout oneDNN picks for the input of a
/// ResNet-sized problem left to it (format_tag::any), found once per process. LayerChain
/// then prefers ActivationLayout::channels16_bf16 to channels_last_bf16, so the activations
/// between convolutions need no reorder on either kind of CPU. False without bf16
/// convolutions (dnn_bf16_convolutions()) and without oneDNN.
inline bool dnn_bf16_blocked() {
#if defined(KAT_ENABLE_ONEDNN)
  static const bool blocked =
      dnn_bf16_convolutions() && onednn_convolution_picks_nchw16c(dnnl::memory::data_type::bf16);
  return blocked;
#else
  return false;
#endif
}

/// What a layer holds where no DNN library serves its space: nothing. A template, so that a
/// member of this type is dependent and the calls under `if constexpr (dnn_available<...>())`
/// are checked only where they are instantiated (Clang checks non-dependent ones anyway).
template <class ExecSpace, class Scalar> struct NoDnn {};

} // namespace detail

// The dispatch classes (defined below in builds with oneDNN), declared in every build so that
// DnnIfAvailable can name them.
template <class ExecSpace, class Scalar> class Conv2dDnn;
template <class ExecSpace, class Scalar> class BatchNormDnn;
template <class ExecSpace, class Scalar> class Pool2dDnn;

#if defined(KAT_ENABLE_ONEDNN)

/// A 2-D convolution through the vendor DNN library, for one layer: forward, backward data
/// and backward weights of Conv2dProblem's on KAT's layouts (see Conv2dProblem), with
/// oneDNN's primitive descriptors, primitives and staging buffers cached per problem (a few
/// batch sizes: a data set's last, smaller batch gets its own plan), so after the first
/// call of a shape no descriptor is created and nothing is allocated.
///
/// oneDNN picks its fastest layout for each operand (blocked over channels, e.g. nChw16c);
/// where that differs from KAT's, the operand is reordered into a staging buffer (inputs) or
/// out of it (outputs). Reorders are counted and timed (reorder_stats(), profiling region
/// "kat::dnn::reorder"). Within one forward/backward, a staged operand is reused instead of
/// reordered again: x from the forward in the backward-weights pass, the weights from the
/// forward in the backward-data pass (same pointer), dy between the two backward passes.
/// The weights and x must therefore not change between forward() and the backward passes,
/// as in any training step.
///
/// Only instantiable where dnn_available<ExecSpace, Scalar>(); every call fences `space`
/// first (host spaces: a no-op after their kernels return) and returns after oneDNN is done.
template <class ExecSpace, class Scalar> class Conv2dDnn {
  static_assert(dnn_available<ExecSpace, Scalar>(),
                "kat::Conv2dDnn: no vendor DNN library for this execution space and scalar "
                "(see kat::dnn_available)");

public:
  /// y = conv(x, w) + b. x: batch·C_in·H·W floats, w: C_out·C_in·k_h·k_w, b: C_out (ignored
  /// without bias), y: batch·C_out·H_out·W_out, all in KAT's layouts (Conv2dProblem).
  /// @throws Error if oneDNN rejects the problem (with its message).
  void forward(const ExecSpace &space, const Conv2dProblem &p, const Scalar *x, const Scalar *w,
               const Scalar *b, Scalar *y) {
    space.fence();
    guarded("forward", p, [&] { plan(p).forward(x, w, b, y, stats_); });
  }

  /// The backward passes for dy = dL/dy (batch·C_out·H_out·W_out) after forward(): unless
  /// dx is null, dx = dL/dx (with the weights w); unless dw is null, dw (C_out x
  /// C_in·k_h·k_w) and db (C_out; ignored without bias) set to dL/dw, dL/db, or added to
  /// them with `accumulate`. x is the last forward()'s input, unchanged since.
  void backward(const ExecSpace &space, const Conv2dProblem &p, const Scalar *x, const Scalar *dy,
                const Scalar *w, Scalar *dx, Scalar *dw, Scalar *db, bool accumulate) {
    space.fence();
    guarded("backward", p, [&] { plan(p).backward(x, dy, w, dx, dw, db, accumulate, stats_); });
  }

  /// Whether oneDNN computes problem p on this CPU. Always true for fp32 (where oneDNN would
  /// fail, forward() reports why); for bf16, false where oneDNN has no bf16 convolution for
  /// the CPU, found once by trying to create the plan (the caller then computes the products
  /// itself, see kat::MixedPrecisionGemm), with the reason kept in bf16_unavailable_reason().
  bool supports(const Conv2dProblem &p) {
    if (p.precision == Precision::fp32) {
      return true;
    }
    if (!bf16_unavailable_.empty()) {
      return false;
    }
    try {
      plan(p);
      return true;
    } catch (const dnnl::error &e) {
      bf16_unavailable_ = e.what();
      return false;
    }
  }
  /// Why oneDNN cannot compute bf16 convolutions here (its error), empty if it can or was
  /// not asked.
  const std::string &bf16_unavailable_reason() const { return bf16_unavailable_; }

  /// Reorders between KAT's layouts and oneDNN's so far.
  const DnnReorderStats &reorder_stats() const { return stats_; }
  /// The oneDNN implementation of each pass for problem p (creating its plan if needed).
  std::string implementations(const Conv2dProblem &p) { return plan(p).implementations(); }
  /// Plans created so far (one per distinct problem seen, the last few kept).
  std::size_t plans_created() const { return plans_.created(); }

private:
  template <class F> static void guarded(const char *pass, const Conv2dProblem &p, F &&f) {
    detail::onednn_guarded("kat::Conv2dDnn", pass,
                           kat::detail::concat("batch ", p.batch, ", input (", p.in_channels, ", ",
                                               p.height, ", ", p.width, "), output (",
                                               p.out_channels, ", ", p.out_height, ", ",
                                               p.out_width, ")"),
                           std::forward<F>(f));
  }

  detail::OnednnConv2dPlan &plan(const Conv2dProblem &p) { return plans_.get(p); }

  detail::OnednnPlanCache<Conv2dProblem, detail::OnednnConv2dPlan> plans_;
  DnnReorderStats stats_;
  std::string bf16_unavailable_;
};

/// Batch normalization through the vendor DNN library, for one layer, in training mode:
/// oneDNN's forward (batch statistics) and backward on a batch in a blocked layout
/// (ActivationLayout::channels16), where the layer's own kernels would read each channel
/// with a stride. Plans are cached per problem as in Conv2dDnn. After forward(), mean() and
/// variance() (biased, as Ioffe & Szegedy's σ²) hold the batch statistics of each channel;
/// after backward(), diff_scale_shift() holds dγ then dβ (affine only), which the layer adds
/// to or writes into its gradients.
template <class ExecSpace, class Scalar> class BatchNormDnn {
  static_assert(dnn_available<ExecSpace, Scalar>(),
                "kat::BatchNormDnn: no vendor DNN library for this execution space and scalar "
                "(see kat::dnn_available)");

public:
  /// y = γ (x − μ) / sqrt(σ² + eps) + β with the batch's μ, σ²; scale_shift is γ then β
  /// (2·channels, ignored without affine).
  /// @throws Error if oneDNN rejects the problem (with its message).
  void forward(const ExecSpace &space, const BatchNormProblem &p, const Scalar *x,
               const Scalar *scale_shift, Scalar *y) {
    space.fence();
    guarded("forward", p, [&] {
      current_ = &plans_.get(p);
      current_->forward(x, scale_shift, y);
    });
  }
  /// dx from dy, after forward() on the same x.
  void backward(const ExecSpace &space, const BatchNormProblem &p, const Scalar *x,
                const Scalar *dy, const Scalar *scale_shift, Scalar *dx) {
    space.fence();
    guarded("backward", p, [&] {
      current_ = &plans_.get(p);
      current_->backward(x, dy, scale_shift, dx);
    });
  }
  /// Per-channel batch mean of the last forward() (channels floats).
  const Scalar *mean() const { return current_->mean(); }
  /// Per-channel biased batch variance of the last forward() (channels floats).
  const Scalar *variance() const { return current_->variance(); }
  /// dγ then dβ of the last backward() (2·channels floats; affine only).
  const Scalar *diff_scale_shift() const { return current_->diff_scale_shift(); }
  /// The oneDNN implementation of each pass for problem p (creating its plan if needed).
  std::string implementations(const BatchNormProblem &p) { return plans_.get(p).implementations(); }

private:
  template <class F> static void guarded(const char *pass, const BatchNormProblem &p, F &&f) {
    detail::onednn_guarded(
        "kat::BatchNormDnn", pass,
        kat::detail::concat("batch ", p.batch, ", channels ", p.channels, ", plane ", p.plane),
        std::forward<F>(f));
  }

  // The plan of the last forward() or backward(): its statistics are what mean() and
  // variance() read (a plan is dropped only when a fifth problem arrives, and then
  // forward() sets this again before anything reads it).
  detail::OnednnPlanCache<BatchNormProblem, detail::OnednnBatchNormPlan> plans_;
  detail::OnednnBatchNormPlan *current_ = nullptr;
};

/// Max or average pooling through the vendor DNN library, for one layer, in training mode, on
/// batches in one of oneDNN's layouts (Pool2dProblem::layout: channels16, channels_last, or
/// their bf16-storage forms; the pooling layers run fp32 channels_last on KAT's own kernels,
/// which beat oneDNN 2.6's AVX2 max pooling several times over); plans cached per
/// problem as in Conv2dDnn. backward() follows the last forward() on the same problem (max
/// pooling routes dy through the argmax that forward recorded).
template <class ExecSpace, class Scalar> class Pool2dDnn {
  static_assert(dnn_available<ExecSpace, Scalar>(),
                "kat::Pool2dDnn: no vendor DNN library for this execution space and scalar "
                "(see kat::dnn_available)");

public:
  /// y = pooled x. @throws Error if oneDNN rejects the problem (with its message).
  void forward(const ExecSpace &space, const Pool2dProblem &p, const Scalar *x, Scalar *y) {
    space.fence();
    guarded("forward", p, [&] { plan(p).forward(x, y); });
  }
  /// dx from dy, after forward() on the same problem.
  void backward(const ExecSpace &space, const Pool2dProblem &p, const Scalar *dy, Scalar *dx) {
    space.fence();
    guarded("backward", p, [&] { plan(p).backward(dy, dx); });
  }
  /// The oneDNN implementation of each pass for problem p (creating its plan if needed).
  std::string implementations(const Pool2dProblem &p) { return plan(p).implementations(); }

private:
  template <class F> static void guarded(const char *pass, const Pool2dProblem &p, F &&f) {
    detail::onednn_guarded("kat::Pool2dDnn", pass,
                           kat::detail::concat("batch ", p.batch, ", input (", p.channels, ", ",
                                               p.height, ", ", p.width, ")"),
                           std::forward<F>(f));
  }

  detail::OnednnPool2dPlan &plan(const Pool2dProblem &p) { return plans_.get(p); }

  detail::OnednnPlanCache<Pool2dProblem, detail::OnednnPool2dPlan> plans_;
};

#endif // KAT_ENABLE_ONEDNN

/// The member a layer keeps for the DNN dispatch: Dnn<ExecSpace, Scalar> (Conv2dDnn,
/// BatchNormDnn, Pool2dDnn) where dnn_available, an empty struct elsewhere (use it under
/// `if constexpr (dnn_available<ExecSpace, Scalar>())`).
#if defined(KAT_ENABLE_ONEDNN)
template <template <class, class> class Dnn, class ExecSpace, class Scalar>
using DnnIfAvailable = std::conditional_t<dnn_available<ExecSpace, Scalar>(),
                                          Dnn<ExecSpace, Scalar>, detail::NoDnn<ExecSpace, Scalar>>;
#else
template <template <class, class> class Dnn, class ExecSpace, class Scalar>
using DnnIfAvailable = detail::NoDnn<ExecSpace, Scalar>;
#endif

} // namespace kat
