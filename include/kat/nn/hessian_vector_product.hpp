#pragma once
/// @file
/// @brief Exact Hessian-vector and Gauss-Newton-vector products of a model's loss, through
/// the layers' R-operator (Pearlmutter 1994).

#include "kat/core/error.hpp"
#include "kat/core/lanczos.hpp"
#include "kat/core/profiling.hpp"
#include "kat/core/views.hpp"
#include "kat/core/workspace.hpp"
#include "kat/nn/detail/hessian_vector_product_kernels.hpp"
#include "kat/nn/sequential.hpp"

#include <Kokkos_Core.hpp>

#include <cstddef>
#include <memory>
#include <utility>

namespace kat::nn {

/// Which curvature matrix a product applies.
enum class CurvatureProduct {
  /// H = ∇²_θ L, the Hessian of the loss (indefinite in general).
  hessian,
  /// G = Jᵀ H_L J, the generalized Gauss-Newton matrix (Schraudolph 2002): J = ∂ output / ∂θ,
  /// H_L = ∇² of the loss with respect to the output; positive semi-definite for convex losses.
  gauss_newton
};

namespace detail {

/// Restores a model's training mode when it goes out of scope.
template <class Model> class EvalModeScope {
public:
  explicit EvalModeScope(Model &m) : model_(m), was_training_(m.training()) { model_.eval(); }
  ~EvalModeScope() {
    if (was_training_) {
      model_.train();
    }
  }
  EvalModeScope(const EvalModeScope &) = delete;
  EvalModeScope &operator=(const EvalModeScope &) = delete;

private:
  Model &model_;
  bool was_training_;
};

/// to(i) = from(i) converted, over the common length.
template <class ExecSpace, class From, class To>
void convert_vector(const ExecSpace &space, const From &from, const To &to) {
  Kokkos::parallel_for("kat::nn::convert_vector",
                       Kokkos::RangePolicy<ExecSpace>(space, 0, to.extent(0)),
                       ConvertVector<From, To>{to, from});
}

} // namespace detail

/// Curvature-vector products of `loss(model(x), targets)` on one batch, with workspaces kept
/// between calls (only the first call, or a larger batch, allocates).
///
/// The products are exact (no finite differences): the Hessian product runs forward,
/// the R-operator forward (R{y} for the direction v), the loss's Hessian on R{output}, and one
/// backward pass that carries dy and R{dy} together (Pearlmutter 1994, "Fast exact
/// multiplication by the Hessian", sec. 3–4) — about two forward and backward passes. The
/// Gauss-Newton product drops the layers' second-order terms: forward, R-operator forward,
/// loss Hessian, one ordinary backward of H_L J v.
///
/// The model runs in evaluation mode for the product and is put back in the mode it had:
/// BatchNorm uses its running statistics (frozen; the Hessian of the network that evaluation
/// runs) and Dropout is the identity, so products are deterministic and symmetric. The
/// model's gradients() are left unchanged, and a backward hook (data parallel) does not run.
///
/// @tparam Loss  SoftmaxCrossEntropy or MSELoss (anything with forward_backward(space,
///               output, targets, grad) and hessian_product(space, output, r_output, out))
template <class Scalar, class MemorySpace, class Loss> class CurvatureVectorProduct {
public:
  using execution_space = typename MemorySpace::execution_space; ///< where the passes run
  using matrix_type = Matrix<Scalar, MemorySpace>;    ///< a batch: batch x features, column-major
  using vector_type = Vector<Scalar, MemorySpace>;    ///< a flat parameter-length vector
  using model_type = Sequential<Scalar, MemorySpace>; ///< the model multiplied through

  /// A product with the Hessian (default) or the Gauss-Newton matrix.
  explicit CurvatureVectorProduct(CurvatureProduct kind = CurvatureProduct::hessian)
      : kind_(kind), dy_("kat::nn::CurvatureVectorProduct::dy"),
        rdy_("kat::nn::CurvatureVectorProduct::rdy") {}

  /// Which curvature matrix apply() multiplies with.
  CurvatureProduct kind() const { return kind_; }

  /// out = C v, C the Hessian or Gauss-Newton matrix of the mean loss of `model` on (x,
  /// targets) at the model's current parameters. Returns the loss on the batch.
  ///
  /// @param space    where the passes run
  /// @param model    compiled, with an R-operator in every layer
  /// @param loss     the loss whose curvature is multiplied (SoftmaxCrossEntropy, MSELoss)
  /// @param x        N x input size
  /// @param targets  what `loss` takes: labels (N) or a target matrix
  /// @param v        the direction: length model.parameter_count(), laid out like
  ///                 model.parameters()
  /// @param out      C v, laid out like v; may not alias v
  /// @throws Error naming the first layer without an R-operator, or if the model has no
  ///   parameters; ShapeError if v or out has the wrong length (and as the loss does).
  template <class Targets>
  double apply(const execution_space &space, model_type &model, const Loss &loss,
               const matrix_type &x, const Targets &targets, const vector_type &v,
               const vector_type &out) {
    ScopedRegion region(kind_ == CurvatureProduct::hessian
                            ? "kat::nn::hessian_vector_product"
                            : "kat::nn::gauss_newton_vector_product");
    const char *who = kind_ == CurvatureProduct::hessian ? "kat::nn::hessian_vector_product"
                                                         : "kat::nn::gauss_newton_vector_product";
    const std::size_t n = model.parameter_count();
    if (n == 0) {
      throw Error(kat::detail::concat(who, ": the model has no parameters"));
    }
    kat::detail::require_extent(who, "v length", n, v.extent(0));
    kat::detail::require_extent(who, "out length", n, out.extent(0));
    if (!model.supports_r_operator()) {
      (void)model.forward_r(space); // throws the error naming the layer
    }
    detail::EvalModeScope<model_type> eval(model);
    const matrix_type &y = model.forward(space, x);
    const matrix_type dy = dy_.matrix(y.extent(0), y.extent(1));
    const matrix_type rdy = rdy_.matrix(y.extent(0), y.extent(1));
    const double value = loss.forward_backward(space, y, targets, dy);
    Kokkos::deep_copy(space, model.direction(), v);
    const matrix_type &ry = model.forward_r(space);
    loss.hessian_product(space, y, ry, rdy);
    if (kind_ == CurvatureProduct::hessian) {
      model.backward_r(space, dy, rdy);
    } else {
      model.backward_to_direction_product(space, rdy);
    }
    Kokkos::deep_copy(space, out, model.direction_product());
    return value;
  }

private:
  CurvatureProduct kind_;
  Workspace<Scalar, MemorySpace> dy_, rdy_;
};

/// The curvature of `loss(model(x), targets)` on one fixed batch as a kat::LinearOperator in
/// double (what kat::lanczos and kat::optim::FOSI take): each application converts v to the
/// model's Scalar, applies CurvatureVectorProduct at the model's parameters of that moment,
/// and converts the product back. The operator keeps `loss`, the views `x` and `targets`
/// (which must stay unchanged: pass copies, not a data loader's reused buffers), the
/// workspaces, and a reference to `model`, which must outlive it.
/// @throws (when applied) as CurvatureVectorProduct::apply.
template <class Scalar, class MemorySpace, class Loss, class Targets>
kat::LinearOperator<MemorySpace>
curvature_operator(Sequential<Scalar, MemorySpace> &model, const Loss &loss,
                   const Matrix<Scalar, MemorySpace> &x, const Targets &targets,
                   CurvatureProduct kind = CurvatureProduct::hessian) {
  using vector_type = Vector<Scalar, MemorySpace>;
  struct State {
    CurvatureVectorProduct<Scalar, MemorySpace, Loss> product;
    Loss loss;
    Matrix<Scalar, MemorySpace> x;
    Targets targets;
    vector_type v, hv;
  };
  const std::size_t n = model.parameter_count();
  auto state =
      std::make_shared<State>(State{CurvatureVectorProduct<Scalar, MemorySpace, Loss>(kind), loss,
                                    x, targets, vector_type("kat::nn::curvature_operator::v", n),
                                    vector_type("kat::nn::curvature_operator::hv", n)});
  Sequential<Scalar, MemorySpace> *m = &model;
  return [state, m](const typename MemorySpace::execution_space &space,
                    const Kokkos::View<const double *, MemorySpace> &v,
                    const Kokkos::View<double *, MemorySpace> &out) {
    detail::convert_vector(space, v, state->v);
    state->product.apply(space, *m, state->loss, state->x, state->targets, state->v, state->hv);
    detail::convert_vector(space, state->hv, out);
  };
}

/// hv = H v, H = ∇²_θ of the mean `loss` of `model` on (x, targets), exact, through the
/// layers' R-operator (Pearlmutter 1994). Returns the loss. Allocates its workspaces on every
/// call: keep a CurvatureVectorProduct to reuse them. See CurvatureVectorProduct::apply for
/// shapes, modes and errors.
template <class Scalar, class MemorySpace, class Loss, class Targets>
double hessian_vector_product(const typename MemorySpace::execution_space &space,
                              Sequential<Scalar, MemorySpace> &model, const Loss &loss,
                              const Matrix<Scalar, MemorySpace> &x, const Targets &targets,
                              const Vector<Scalar, MemorySpace> &v,
                              const Vector<Scalar, MemorySpace> &hv) {
  CurvatureVectorProduct<Scalar, MemorySpace, Loss> product(CurvatureProduct::hessian);
  return product.apply(space, model, loss, x, targets, v, hv);
}

/// gv = Jᵀ H_L J v, the generalized Gauss-Newton product (positive semi-definite for a convex
/// loss): J = ∂ output / ∂θ, H_L the loss's Hessian in the output. Returns the loss. As
/// hessian_vector_product otherwise.
template <class Scalar, class MemorySpace, class Loss, class Targets>
double gauss_newton_vector_product(const typename MemorySpace::execution_space &space,
                                   Sequential<Scalar, MemorySpace> &model, const Loss &loss,
                                   const Matrix<Scalar, MemorySpace> &x, const Targets &targets,
                                   const Vector<Scalar, MemorySpace> &v,
                                   const Vector<Scalar, MemorySpace> &gv) {
  CurvatureVectorProduct<Scalar, MemorySpace, Loss> product(CurvatureProduct::gauss_newton);
  return product.apply(space, model, loss, x, targets, v, gv);
}

} // namespace kat::nn
