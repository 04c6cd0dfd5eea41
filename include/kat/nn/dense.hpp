#pragma once
/// @file
/// @brief Fully connected layer y = x Wᵀ + b.

#include "kat/core/blas.hpp"
#include "kat/core/error.hpp"
#include "kat/core/policy.hpp"
#include "kat/core/profiling.hpp"
#include "kat/core/views.hpp"
#include "kat/core/workspace.hpp"
#include "kat/nn/init.hpp"
#include "kat/nn/layer.hpp"

#include <Kokkos_Core.hpp>

#include <cmath>
#include <cstdint>
#include <string>

namespace kat::nn {

namespace detail {

/// a(i, j) = x(i, j) for the x.extent(1) columns of x and 1 in any further column of a:
/// a = [x 1] when a has one column more than x. a: rows x (>= x columns), same rows as x.
template <class ExecSpace, class XView, class AView>
void copy_with_ones_column(const ExecSpace &space, const XView &x, const AView &a) {
  using value = typename AView::non_const_value_type;
  const std::size_t in = x.extent(1);
  Kokkos::parallel_for(
      "kat::nn::Dense::record_a", matrix_policy(space, a.extent(0), a.extent(1)),
      KOKKOS_LAMBDA(const std::size_t i, const std::size_t j) {
        a(i, j) = j < in ? x(i, j) : value(1);
      });
}

} // namespace detail

/// Fully connected (Linear) layer: y = x Wᵀ + b, x: N x in, W: out x in, b: out, y: N x out.
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
template <class Scalar = float, class MemorySpace = DefaultMemorySpace>
class Dense final : public Layer<Scalar, MemorySpace> {
  using base = Layer<Scalar, MemorySpace>;

public:
  using typename base::execution_space;
  using typename base::matrix_type;

  /// @throws ValueError if either size is 0.
  Dense(std::size_t in_features, std::size_t out_features, bool bias = true)
      : in_(in_features), out_(out_features), bias_(bias), a_("kat::nn::Dense::a") {
    if (in_ == 0 || out_ == 0) {
      throw ValueError(kat::detail::concat("kat::nn::Dense: in_features and out_features must be "
                                           "> 0, got in_features = ",
                                           in_, ", out_features = ", out_));
    }
  }

  std::string name() const override { return "Dense"; }
  std::size_t in_features() const { return in_; }
  std::size_t out_features() const { return out_; }
  bool has_bias() const { return bias_; }

  FeatureShape output_shape(const FeatureShape &input) const override {
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
  const matrix_type &weight_gradient() const { return grad_weight_; }
  const Vector<Scalar, MemorySpace> &bias_gradient() const { return grad_bias_; }

  void forward(const execution_space &space, const matrix_type &x, const matrix_type &y) override {
    ScopedRegion region("kat::nn::Dense::forward");
    const std::size_t n = x.extent(0);
    kat::detail::require_extent("kat::nn::Dense::forward", "x columns", in_, x.extent(1));
    kat::detail::require_extent("kat::nn::Dense::forward", "y rows", n, y.extent(0));
    kat::detail::require_extent("kat::nn::Dense::forward", "y columns", out_, y.extent(1));
    x_ = x;
    if (this->recording_ && bias_) {
      // a = [x 1]; then y = a [W b]ᵀ is one GEMM that also adds the bias.
      record_activations(space, x);
      gemm(space, Trans::N, Trans::T, Scalar(1), a_view_, weight_bias_, Scalar(0), y);
      return;
    }
    if (this->recording_) {
      record_activations(space, x);
    }
    if (bias_) {
      const auto b = bias_view_;
      Kokkos::parallel_for(
          "kat::nn::Dense::forward_bias", matrix_policy(space, n, out_),
          KOKKOS_LAMBDA(const std::size_t i, const std::size_t j) { y(i, j) = b(j); });
    }
    gemm(space, Trans::N, Trans::T, Scalar(1), x, weight_, Scalar(bias_ ? 1 : 0), y);
  }

  void backward(const execution_space &space, const matrix_type &dy,
                const matrix_type &dx) override {
    ScopedRegion region("kat::nn::Dense::backward");
    const std::size_t n = x_.extent(0);
    kat::detail::require_extent("kat::nn::Dense::backward", "dy rows", n, dy.extent(0));
    kat::detail::require_extent("kat::nn::Dense::backward", "dy columns", out_, dy.extent(1));
    if (this->recording_) {
      g_ = dy;
    }
    // dW (+)= dyᵀ x
    const bool accumulate = this->accumulate_;
    gemm(space, Trans::T, Trans::N, Scalar(1), dy, x_, Scalar(accumulate ? 1 : 0), grad_weight_);
    if (bias_) {
      // db (+)= column sums of dy, one team per output feature.
      const auto db = grad_bias_;
      using team_policy = Kokkos::TeamPolicy<execution_space>;
      using member = typename team_policy::member_type;
      Kokkos::parallel_for(
          "kat::nn::Dense::backward_bias", team_policy(space, out_, Kokkos::AUTO),
          KOKKOS_LAMBDA(const member &team) {
            const std::size_t j = team.league_rank();
            Scalar sum = 0;
            Kokkos::parallel_reduce(
                Kokkos::TeamThreadRange(team, n),
                [&](const std::size_t i, Scalar &s) { s += dy(i, j); }, sum);
            Kokkos::single(Kokkos::PerTeam(team),
                           [&]() { db(j) = accumulate ? db(j) + sum : sum; });
          });
    }
    if (dx.extent(0) != 0) {
      kat::detail::require_extent("kat::nn::Dense::backward", "dx rows", n, dx.extent(0));
      kat::detail::require_extent("kat::nn::Dense::backward", "dx columns", in_, dx.extent(1));
      // dx = dy W
      gemm(space, Trans::N, Trans::N, Scalar(1), dy, weight_, Scalar(0), dx);
    }
  }

  bool supports_curvature() const override { return true; }
  CurvatureRecord<Scalar, MemorySpace> curvature() const override {
    return {a_view_, g_, grad_weight_bias_, weight_bias_, x_.extent(0)};
  }

private:
  void record_activations(const execution_space &space, const matrix_type &x) {
    const std::size_t n = x.extent(0);
    const std::size_t cols = in_ + (bias_ ? 1 : 0);
    a_view_ = a_.matrix(n, cols);
    detail::copy_with_ones_column(space, x, a_view_);
  }

  std::size_t in_, out_;
  bool bias_;
  matrix_type weight_bias_, grad_weight_bias_, weight_, grad_weight_;
  Vector<Scalar, MemorySpace> bias_view_, grad_bias_;
  matrix_type x_;
  Workspace<Scalar, MemorySpace> a_;
  matrix_type a_view_, g_;
};

} // namespace kat::nn
