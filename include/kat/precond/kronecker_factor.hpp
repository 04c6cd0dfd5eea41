#pragma once
/// @file
/// @brief One running-averaged Kronecker factor of K-FAC and its decomposition.

#include "kat/core/blas.hpp"
#include "kat/core/detail/convert.hpp"
#include "kat/core/error.hpp"
#include "kat/core/host_sync.hpp"
#include "kat/core/linalg.hpp"
#include "kat/core/math.hpp"
#include "kat/core/policy.hpp"
#include "kat/core/profiling.hpp"
#include "kat/core/state.hpp"
#include "kat/core/views.hpp"
#include "kat/core/workspace.hpp"

#include <Kokkos_Core.hpp>

#include <cmath>
#include <cstddef>
#include <string>
#include <type_traits>
#include <utility>

namespace kat {

namespace detail {

// The kernels of KroneckerFactor are named functors, not extended device lambdas: nvcc's
// wrapper of an extended lambda in a header is merged across translation units while its
// function pointers are not (issue 31, docs/backends.md).

/// Entry (i, j), i <= j, of running_average(): the new factor entry v into b(i, j) and b(j, i),
/// counting it when not finite.
template <class MatrixView, class Count> struct KroneckerRunningAverage {
  using Scalar = typename MatrixView::non_const_value_type;
  MatrixView b;
  bool first;
  Scalar a;
  MatrixView f;
  Scalar c;

  KOKKOS_INLINE_FUNCTION void operator()(const std::size_t i, const std::size_t j,
                                         Count &count) const {
    if (i > j) {
      return;
    }
    const Scalar sym = Scalar(0.5) * (b(i, j) + b(j, i));
    const Scalar v = first ? sym : a * f(i, j) + c * sym;
    b(i, j) = v;
    b(j, i) = v;
    count += kat::math::isfinite(v) ? Count(0) : Count(1);
  }
};

/// Entry (i, j) of copy_shifted(): dst(i, j) = f(i, j) + (i == j ? s : 0) in dst's scalar.
template <class FView, class DstView> struct KroneckerCopyShifted {
  using value = typename DstView::non_const_value_type;
  DstView dst;
  FView f;
  value s;

  KOKKOS_INLINE_FUNCTION void operator()(const std::size_t i, const std::size_t j) const {
    dst(i, j) = static_cast<value>(f(i, j)) + (i == j ? s : value(0));
  }
};

/// Entry i of KroneckerFactor::mean_eigenvalue's trace: t += f(i, i) in double.
template <class MatrixView> struct KroneckerTrace {
  MatrixView f;

  KOKKOS_INLINE_FUNCTION void operator()(const std::size_t i, double &t) const {
    t += static_cast<double>(f(i, i));
  }
};

/// Entry i of KroneckerFactor::compute_eigen's clamp: d(i) = max(d(i), 0).
template <class VectorView> struct KroneckerClampEigenvalues {
  using InverseScalar = typename VectorView::non_const_value_type;
  VectorView d;

  KOKKOS_INLINE_FUNCTION void operator()(const std::size_t i) const {
    d(i) = d(i) > InverseScalar(0) ? d(i) : InverseScalar(0);
  }
};

/// The running-average pass of KroneckerFactor::update over the d x d batch estimate b and
/// factor f: for each (i, j) with i <= j, v = sym if `first`, else alpha·f(i, j) + beta·sym,
/// with sym = (b(i, j) + b(j, i)) / 2 (alpha and beta rounded to b's scalar first), is written
/// to b(i, j) and b(j, i). Each work item reads and writes only its own symmetric pair, so
/// working in place is race-free. f is not read when `first`. The number of non-finite results
/// (0: b holds the new factor) is written to the rank-0 view `bad` without blocking the host.
template <class ExecSpace, class MatrixView, class CountView>
void running_average(const ExecSpace &space, const MatrixView &f, const MatrixView &b, bool first,
                     double alpha, double beta, const CountView &bad) {
  using Scalar = typename MatrixView::non_const_value_type;
  using Count = typename CountView::non_const_value_type;
  const Scalar a = static_cast<Scalar>(alpha);
  const Scalar c = static_cast<Scalar>(beta);
  Kokkos::parallel_reduce("kat::precond::KroneckerFactor::running_average",
                          matrix_policy(space, b.extent(0), b.extent(1)),
                          KroneckerRunningAverage<MatrixView, Count>{b, first, a, f, c}, bad);
}

/// dst = f + shift·I, converted to dst's scalar type (f and dst: d x d).
template <class ExecSpace, class FView, class DstView>
void copy_shifted(const ExecSpace &space, const FView &f, const DstView &dst, double shift) {
  using value = typename DstView::non_const_value_type;
  const value s = static_cast<value>(shift);
  Kokkos::parallel_for("kat::precond::KroneckerFactor::copy",
                       matrix_policy(space, dst.extent(0), dst.extent(1)),
                       KroneckerCopyShifted<FView, DstView>{dst, f, s});
}

} // namespace detail

namespace precond {

/// The default batch hook of KroneckerFactor::update: does nothing (and costs nothing).
struct NoBatchHook {
  /// Does nothing.
  template <class ExecSpace, class View> void operator()(const ExecSpace &, const View &) const {}
};

/// A symmetric d x d Kronecker factor F of K-FAC (Martens & Grosse 2015, Sec. 3; Grosse &
/// Martens 2016 for convolutions), kept as an exponential running average of batch estimates
/// `scale * xᵀx`, together with its latest decomposition:
///
/// - eigen: F = Q diag(d) Qᵀ with d clamped at 0 (negative eigenvalues are rounding noise of
///   a positive semi-definite matrix);
/// - inverse: (F + λI)⁻¹ for a Tikhonov damping λ given at decomposition time.
///
/// @tparam Scalar         precision the factor is accumulated in ("factor precision").
/// @tparam MemorySpace    where the factor and its decomposition live.
/// @tparam InverseScalar  precision of the decomposition ("inverse precision"; double by
///                        default, as in docs/algorithms.md section 1).
///
/// A failed decomposition leaves the previous one in place (the new one is computed into a
/// second buffer and swapped in only on success), so a caller may choose to keep using it.
template <class Scalar = float, class MemorySpace = DefaultMemorySpace,
          class InverseScalar = double>
class KroneckerFactor {
public:
  using scalar_type = Scalar;                      ///< the factor's precision
  using inverse_scalar_type = InverseScalar;       ///< the decompositions' precision
  using memory_space = MemorySpace;                ///< where the factor lives
  using matrix_type = Matrix<Scalar, MemorySpace>; ///< F: dim x dim, Scalar
  /// An inverse or eigenvectors: dim x dim.
  using inverse_matrix_type = Matrix<InverseScalar, MemorySpace>;
  using inverse_vector_type = Vector<InverseScalar, MemorySpace>; ///< eigenvalues: dim

  /// An empty factor of dimension `dim`; `label` names its allocations and errors
  /// (e.g. "kat::precond::KFAC::0.Dense::A"). Nothing is allocated until the first update() or
  /// assign(), so a factor that is never updated (a layer another rank owns in
  /// kat::distributed::DPKFAC) holds no memory.
  KroneckerFactor(std::string label, std::size_t dim)
      : label_(std::move(label)), dim_(dim), cast_(label_ + "::cast") {}

  /// The label given at construction (names allocations and errors).
  const std::string &label() const { return label_; }
  /// The dimension d of the d x d factor.
  std::size_t dim() const { return dim_; }

  /// Number of update() calls that changed the factor (0: the factor holds no data yet).
  std::size_t updates() const { return updates_; }

  /// The running average F (dim x dim, symmetric); an empty view before the first update()
  /// or assign().
  const matrix_type &factor() const { return factor_; }

  /// Folds a batch estimate into the running average (docs/algorithms.md section 1):
  /// `F_new = scale · xᵀx`, symmetrized; `F ← decay·F + (1 − decay)·F_new`, or `F = F_new` on
  /// the first update. Blocks the host until the result is known (stage_update() does not).
  ///
  /// @param x      rows x dim LayoutLeft view (a or g of a layer), any scalar type; converted
  ///               to Scalar first when it differs.
  /// @param scale  the estimator's normalization (1/rows for A, N²/rows for G of a mean loss).
  /// @param decay  factor_decay in [0, 1).
  /// @param hook   optional callable `hook(space, batch)`, called once with the batch estimate
  ///               `batch = scale · xᵀx` (a dim x dim matrix_type, both triangles filled) after
  ///               it is computed and before it is symmetrized, averaged into F and checked
  ///               for finiteness. It may modify the entries in place (the shape and the
  ///               memory are fixed; keep no reference to the view after it returns): e.g.
  ///               distributed K-FAC averages it over ranks. Work it enqueues on `space` is
  ///               ordered before the running average. The default does nothing.
  /// @param space  where the work runs
  /// @return false, leaving F unchanged, if F_new has a NaN or an infinity; true otherwise.
  /// @throws ShapeError if x has not dim columns; whatever the hook throws (F is then
  ///   unchanged).
  template <class ExecSpace, class XView, class BatchHook = NoBatchHook>
  bool update(const ExecSpace &space, const XView &x, double scale, double decay,
              const BatchHook &hook = BatchHook()) {
    if (bad_.data() == nullptr) {
      bad_ = Kokkos::View<int, MemorySpace>(label_ + "::bad");
    }
    stage_update(space, x, scale, decay, bad_, hook);
    int bad = 0;
    Kokkos::deep_copy(space, Kokkos::View<int, Kokkos::HostSpace>(&bad), bad_);
    kat::detail::fence(space);
    if (bad != 0) {
      discard_update();
      return false;
    }
    commit_update();
    return true;
  }

  /// update() without waiting for the device: the new running average is computed into a
  /// second buffer and the number of its non-finite entries written to `bad` (a rank-0 view of
  /// an arithmetic type in MemorySpace, overwritten). F is unchanged until commit_update()
  /// makes the staged average current (after the caller has read `bad` back and found 0) or
  /// discard_update() drops it; a second stage_update() replaces the staged average.
  /// Parameters and errors as update().
  template <class ExecSpace, class XView, class CountView, class BatchHook = NoBatchHook>
  void stage_update(const ExecSpace &space, const XView &x, double scale, double decay,
                    const CountView &bad, const BatchHook &hook = BatchHook()) {
    ScopedRegion region("kat::precond::KroneckerFactor::update");
    kat::detail::require_extent((label_ + "::update").c_str(), "x columns", dim_,
                                static_cast<std::size_t>(x.extent(1)));
    allocate();
    staged_ = false;
    using x_scalar = typename XView::non_const_value_type;
    if constexpr (std::is_same<x_scalar, Scalar>::value) {
      gemm(space, Trans::T, Trans::N, static_cast<Scalar>(scale), x, x, Scalar(0), batch_);
    } else {
      const matrix_type xs = cast_.matrix(x.extent(0), x.extent(1));
      kat::detail::convert(space, x, xs);
      gemm(space, Trans::T, Trans::N, static_cast<Scalar>(scale), xs, xs, Scalar(0), batch_);
    }
    hook(space, static_cast<const matrix_type &>(batch_));
    // One pass: each (i, j) with i <= j reads both batch entries and F(i, j) and writes the
    // new value to both symmetric entries of the batch buffer (no other work item touches
    // them, so in place is race-free), counting non-finite results. On commit the buffers
    // swap, so a failed update leaves F untouched at no extra cost.
    const bool first = updates_ == 0;
    detail::running_average(space, factor_, batch_, first, first ? 0.0 : decay,
                            first ? 1.0 : 1.0 - decay, bad);
    staged_ = true;
  }

  /// Whether stage_update() left an average that is neither committed nor discarded.
  bool has_staged_update() const { return staged_; }

  /// Makes the staged average F (see stage_update()).
  /// @throws Error if there is none.
  void commit_update() {
    if (!staged_) {
      throw Error(label_ + "::commit_update: no staged update to commit");
    }
    std::swap(factor_, batch_);
    ++updates_;
    staged_ = false;
  }

  /// Drops the staged average (see stage_update()); F stays as it was.
  void discard_update() { staged_ = false; }

  /// Overwrites F (for load_state); `values` is a dim x dim host or device view.
  template <class ExecSpace, class View> void assign(const ExecSpace &space, const View &values) {
    kat::detail::require_extent((label_ + "::assign").c_str(), "rows", dim_,
                                static_cast<std::size_t>(values.extent(0)));
    kat::detail::require_extent((label_ + "::assign").c_str(), "columns", dim_,
                                static_cast<std::size_t>(values.extent(1)));
    allocate();
    Kokkos::deep_copy(space, factor_, values);
    updates_ = 1;
    staged_ = false;
  }

  /// tr(F) / dim, the mean eigenvalue (π-correction of the inverse path).
  template <class ExecSpace> double mean_eigenvalue(const ExecSpace &space) const {
    const matrix_type f = factor_;
    double trace = 0;
    Kokkos::parallel_reduce("kat::precond::KroneckerFactor::trace",
                            Kokkos::RangePolicy<ExecSpace>(space, 0, dim_),
                            detail::KroneckerTrace<matrix_type>{f}, trace);
    return dim_ == 0 ? 0.0 : trace / static_cast<double>(dim_);
  }

  /// Computes F = Q diag(d) Qᵀ in InverseScalar (kat::symmetric_eigen), d clamped at 0.
  /// @throws NumericalError (from the solver) if F is not finite or the solver fails; the
  ///   previous decomposition is then still in place.
  template <class ExecSpace> void compute_eigen(const ExecSpace &space) {
    ScopedRegion region("kat::precond::KroneckerFactor::compute_eigen");
    ensure(next_q_, label_ + "::Q");
    if (next_d_.extent(0) != dim_) {
      next_d_ = inverse_vector_type(label_ + "::d", dim_);
    }
    detail::copy_shifted(space, factor_, next_q_, 0.0);
    symmetric_eigen(space, next_q_, next_d_);
    const inverse_vector_type d = next_d_;
    Kokkos::parallel_for("kat::precond::KroneckerFactor::clamp_eigenvalues",
                         Kokkos::RangePolicy<ExecSpace>(space, 0, dim_),
                         detail::KroneckerClampEigenvalues<inverse_vector_type>{d});
    std::swap(q_, next_q_);
    std::swap(d_, next_d_);
    has_eigen_ = true;
  }

  /// Computes (F + damping·I)⁻¹ in InverseScalar through a Cholesky factorization
  /// (kat::cholesky_inverse).
  /// @throws NumericalError if F + damping·I is not finite or not positive definite; the
  ///   previous inverse is then still in place.
  template <class ExecSpace> void compute_inverse(const ExecSpace &space, double damping) {
    ScopedRegion region("kat::precond::KroneckerFactor::compute_inverse");
    ensure(next_inverse_, label_ + "::inverse");
    detail::copy_shifted(space, factor_, next_inverse_, damping);
    cholesky_inverse(space, next_inverse_);
    std::swap(inverse_, next_inverse_);
    has_inverse_ = true;
  }

  /// Whether an eigendecomposition has been computed (compute_eigen()).
  bool has_eigen() const { return has_eigen_; }
  /// Whether an inverse has been computed (compute_inverse()).
  bool has_inverse() const { return has_inverse_; }
  /// Q: eigenvectors in columns (dim x dim), valid when has_eigen().
  const inverse_matrix_type &eigenvectors() const { return q_; }
  /// d: eigenvalues, ascending, >= 0 (dim), valid when has_eigen().
  const inverse_vector_type &eigenvalues() const { return d_; }
  /// (F + λI)⁻¹ (dim x dim), valid when has_inverse().
  const inverse_matrix_type &inverse() const { return inverse_; }

  /// Receiving a decomposition computed elsewhere (distributed K-FAC, kat::distributed::KAISA):
  /// returns buffers for Q (dim x dim) and d (dim), allocated if needed, for the caller to fill
  /// with the eigendecomposition (eigenvectors in columns, eigenvalues ascending and >= 0). They
  /// become eigenvectors() and eigenvalues(), and has_eigen() true, only at
  /// commit_received_eigen(); until then (and if it is never called, e.g. because the
  /// transfer failed) the current decomposition stays in place.
  std::pair<inverse_matrix_type, inverse_vector_type> receive_eigen() {
    ensure(next_q_, label_ + "::Q");
    if (next_d_.extent(0) != dim_) {
      next_d_ = inverse_vector_type(label_ + "::d", dim_);
    }
    received_ = true;
    return {next_q_, next_d_};
  }
  /// Makes the buffers of receive_eigen() the current eigendecomposition.
  /// @throws Error if receive_eigen() was not called since the last commit.
  void commit_received_eigen() {
    take_received("commit_received_eigen");
    std::swap(q_, next_q_);
    std::swap(d_, next_d_);
    has_eigen_ = true;
  }
  /// As receive_eigen() for the inverse (F + λI)⁻¹: returns a dim x dim buffer to fill, which
  /// becomes inverse() at commit_received_inverse().
  inverse_matrix_type receive_inverse() {
    ensure(next_inverse_, label_ + "::inverse");
    received_ = true;
    return next_inverse_;
  }
  /// Makes the buffer of receive_inverse() the current inverse.
  /// @throws Error if receive_inverse() was not called since the last commit.
  void commit_received_inverse() {
    take_received("commit_received_inverse");
    std::swap(inverse_, next_inverse_);
    has_inverse_ = true;
  }

  /// The factor's state (kat/core/state.hpp): "updates" (uint64), and as far as they exist
  /// "factor" (Scalar, [dim, dim]), "eigenvectors" (InverseScalar, [dim, dim]) with
  /// "eigenvalues" ([dim]), and "inverse" ([dim, dim]). Decompositions are part of the state:
  /// recomputing them from a newer factor would not continue a run exactly. Fences.
  StateDict state_dict() const {
    StateDict s;
    s.set("updates", static_cast<std::uint64_t>(updates_));
    if (updates_ > 0) {
      s.set_view("factor", factor_);
    }
    if (has_eigen_) {
      s.set_view("eigenvectors", q_);
      s.set_view("eigenvalues", d_);
    }
    if (has_inverse_) {
      s.set_view("inverse", inverse_);
    }
    return s;
  }

  /// Throws StateError unless `state` is a state_dict() of a factor of this dimension and
  /// precisions; changes nothing.
  void check_state_dict(const StateDict &state) const {
    std::vector<std::string> names{"updates"};
    const std::vector<std::uint64_t> square{dim_, dim_}, vector{dim_};
    const auto updates = state.get<std::uint64_t>("updates");
    if (updates > 0) {
      names.push_back("factor");
      state.checked<Scalar>("factor", square);
    }
    if (state.contains("eigenvectors") || state.contains("eigenvalues")) {
      names.insert(names.end(), {"eigenvectors", "eigenvalues"});
      state.checked<InverseScalar>("eigenvectors", square);
      state.checked<InverseScalar>("eigenvalues", vector);
    }
    if (state.contains("inverse")) {
      names.push_back("inverse");
      state.checked<InverseScalar>("inverse", square);
    }
    state.require_names(label_ + "::load_state_dict", names);
  }

  /// Restores what state_dict() saved (check_state_dict() first: a failed load changes
  /// nothing). A decomposition absent from `state` is dropped. Fences.
  /// @throws StateError as check_state_dict().
  void load_state_dict(const StateDict &state) {
    check_state_dict(state);
    updates_ = static_cast<std::size_t>(state.get<std::uint64_t>("updates"));
    staged_ = received_ = false;
    if (updates_ > 0) {
      allocate();
      state.copy_to("factor", factor_);
    }
    has_eigen_ = state.contains("eigenvectors");
    if (has_eigen_) {
      ensure(q_, label_ + "::Q");
      if (d_.extent(0) != dim_) {
        d_ = inverse_vector_type(label_ + "::d", dim_);
      }
      state.copy_to("eigenvectors", q_);
      state.copy_to("eigenvalues", d_);
    }
    has_inverse_ = state.contains("inverse");
    if (has_inverse_) {
      ensure(inverse_, label_ + "::inverse");
      state.copy_to("inverse", inverse_);
    }
  }

  /// Bytes of memory this factor holds now: F and the batch buffer, the conversion
  /// workspace, and the decompositions with their double buffers (all allocated on first
  /// use: 0 for a factor never updated).
  std::size_t bytes() const {
    const auto size = [](const auto &v) { return static_cast<std::size_t>(v.span()); };
    return (size(factor_) + size(batch_) + cast_.capacity()) * sizeof(Scalar) +
           (size(q_) + size(next_q_) + size(inverse_) + size(next_inverse_) + size(d_) +
            size(next_d_)) *
               sizeof(InverseScalar);
  }

private:
  void take_received(const char *what) {
    if (!received_) {
      throw Error(label_ + "::" + what + ": nothing was received to commit");
    }
    received_ = false;
  }

  /// F and the batch buffer, on first use.
  void allocate() {
    if (factor_.extent(0) != dim_) {
      factor_ = matrix_type(Kokkos::view_alloc(label_, Kokkos::WithoutInitializing), dim_, dim_);
    }
    if (batch_.extent(0) != dim_) {
      batch_ = matrix_type(Kokkos::view_alloc(label_ + "::batch", Kokkos::WithoutInitializing),
                           dim_, dim_);
    }
  }

  void ensure(inverse_matrix_type &m, const std::string &label) const {
    if (m.extent(0) != dim_) {
      m = inverse_matrix_type(Kokkos::view_alloc(label, Kokkos::WithoutInitializing), dim_, dim_);
    }
  }

  std::string label_;
  std::size_t dim_;
  matrix_type factor_, batch_;
  Workspace<Scalar, MemorySpace> cast_;
  std::size_t updates_ = 0;
  bool staged_ = false, received_ = false;
  Kokkos::View<int, MemorySpace> bad_; // update()'s count of non-finite entries
  inverse_matrix_type q_, next_q_, inverse_, next_inverse_;
  inverse_vector_type d_, next_d_;
  bool has_eigen_ = false, has_inverse_ = false;
};

} // namespace precond
} // namespace kat
