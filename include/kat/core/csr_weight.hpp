#pragma once
/// @file
/// @brief The CSR structure of a masked weight matrix and the three products a sparse layer
/// needs: y = x Wᵀ, dx = dy W and the weight gradient sampled at the active entries.

#include "kat/core/blas.hpp"
#include "kat/core/detail/unrolled_sum.hpp"
#include "kat/core/error.hpp"
#include "kat/core/profiling.hpp"
#include "kat/core/views.hpp"
#include "kat/core/workspace.hpp"

#include <KokkosSparse_CrsMatrix.hpp>
// Kokkos Kernels 3.4's spmv instantiates its transpose kernels too (the mode is a run-time
// argument), and GCC warns about a member those never initialize on the host.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <KokkosSparse_spmv.hpp>
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif
#include <Kokkos_Core.hpp>

#include <climits>
#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>

/// 1 where Kokkos Kernels (4.2 and later) has the KokkosSparse::spmv overload taking an
/// execution-space instance, else 0; an internal switch of CsrWeight's products.
#if defined(KOKKOSKERNELS_VERSION) && KOKKOSKERNELS_VERSION >= 40200
#define KAT_KOKKOSSPARSE_HAS_SPACE_ARGUMENT 1
#else
#define KAT_KOKKOSSPARSE_HAS_SPACE_ARGUMENT 0
#endif

// In namespace kat::sparse (the sparse-matrix vocabulary of a masked layer) but on the core
// floor: kat::nn's Dense layer runs its sparse path through it, and nn must not include the
// sparse-training floor above it (scripts/include_graph.sh).
namespace kat::sparse {

/// How a layer with a weight mask computes its products.
enum class SparsePath {
  automatic, ///< sparse when the mask's density is below the layer's crossover, else dense
  dense,     ///< dense GEMMs on the full matrix (inactive weights are 0 in the buffer)
  sparse     ///< CSR products over the active weights only
};

/// Mask density below which SparsePath::automatic takes the sparse path.
///
/// Measured for the Dense layers of the 784-256-256-10 MLP at batch 128, float, Serial backend
/// with OpenBLAS on the 2-core development machine (`BM_SparseMLPLayers` in
/// bench/bench_sparse.cpp, docs/benchmarks.md "The sparse execution path of Dense"): forward +
/// backward on the sparse path takes 1.05x less time than the dense path at density 0.2 and
/// 2.4x more at 0.5, so the paths cross just above 0.2. Other machines, backends and batch
/// sizes move it; layers take an override (kat::nn::Dense::set_sparse_crossover).
inline constexpr double default_sparse_crossover = 0.2;

namespace detail {

/// Whether kernels of ExecSpace run on the host (Serial, OpenMP, Threads), where the
/// sampled-gradient kernel vectorizes its dot products by hand instead of using vector lanes.
template <class ExecSpace>
inline constexpr bool is_host_space_v =
    std::is_same<typename ExecSpace::memory_space, Kokkos::HostSpace>::value;

/// Σ_i a[i] b[i] for i < n, in unrolled_sum's 16 interleaved partial sums (a fixed order, so
/// the result is deterministic) that compilers turn into SIMD multiply-adds.
template <class Scalar>
KOKKOS_INLINE_FUNCTION Scalar unrolled_dot(const Scalar *a, const Scalar *b, std::size_t n) {
  return kat::detail::unrolled_sum<Scalar>(n, [&](std::size_t i) { return a[i] * b[i]; });
}

/// dW(r, c) (+)= Σ_i dy(i, r) x(i, c) for every active (r, c), one team per column c of W,
/// walking the CSR structure of Wᵀ (row c of Wᵀ lists the active r of W's column c). dy:
/// N x rows and x: N x cols, LayoutLeft (their columns are contiguous); dw: rows x cols,
/// contiguous column-major. Without `accumulate`, the team first zeroes its column of dW, so
/// the inactive entries become 0 in the same pass over dW that writes the active ones (a
/// separate memset of dW cost as much again at 1-2% density).
template <class ExecSpace, class Scalar, class RowMap, class Entries, class DY, class X, class DW>
struct SampledGradient {
  using member = typename Kokkos::TeamPolicy<ExecSpace>::member_type;
  RowMap row_map;
  Entries rows_of;
  DY dy;
  X x;
  DW dw;
  std::size_t n;
  bool accumulate;

  KOKKOS_INLINE_FUNCTION void operator()(const member &team) const {
    const int c = team.league_rank();
    const int begin = row_map(c), end = row_map(c + 1);
    const std::size_t rows = dw.extent(0);
    Scalar *dw_c = dw.data() + std::size_t(c) * rows;
    if constexpr (is_host_space_v<ExecSpace>) {
      if (!accumulate) {
        for (std::size_t r = 0; r < rows; ++r) {
          dw_c[r] = Scalar(0);
        }
      }
      const Scalar *x_c = x.data() + std::size_t(c) * x.stride(1);
      for (int k = begin; k < end; ++k) {
        const int r = rows_of(k);
        const Scalar s = unrolled_dot(dy.data() + std::size_t(r) * dy.stride(1), x_c, n);
        dw_c[r] = accumulate ? dw_c[r] + s : s;
      }
    } else {
      if (!accumulate) {
        Kokkos::parallel_for(Kokkos::TeamVectorRange(team, rows),
                             [&](const std::size_t r) { dw_c[r] = Scalar(0); });
        team.team_barrier();
      }
      Kokkos::parallel_for(Kokkos::TeamThreadRange(team, begin, end), [&](const int k) {
        const int r = rows_of(k);
        Scalar s = 0;
        Kokkos::parallel_reduce(
            Kokkos::ThreadVectorRange(team, n),
            [&](const std::size_t i, Scalar &part) { part += dy(i, r) * x(i, c); }, s);
        Kokkos::single(Kokkos::PerThread(team), [&]() { dw_c[r] = accumulate ? dw_c[r] + s : s; });
      });
    }
  }
};

// The kernels of CsrWeight below are named functors, not extended device lambdas: nvcc's
// wrapper of an extended lambda in a header is merged across translation units while its
// function pointers are not (issue 31, docs/backends.md).

/// Entry k of CsrWeight::gather: vals(k) = data[flat(k)].
template <class ValuesView, class Scalar, class FlatView> struct CsrGather {
  ValuesView vals;
  const Scalar *data;
  FlatView flat;

  KOKKOS_INLINE_FUNCTION void operator()(const std::size_t k) const { vals(k) = data[flat(k)]; }
};

/// Row i of CsrWeight::build_structure's count: counts(i) = the active entries of row i of M.
template <class MaskView, class CountsView> struct CsrRowCounts {
  int n;
  MaskView mask;
  std::size_t si, sj;
  CountsView counts;

  KOKKOS_INLINE_FUNCTION void operator()(const int i) const {
    int count = 0;
    for (int j = 0; j < n; ++j) {
      count += mask(i * si + j * sj) != 0 ? 1 : 0;
    }
    counts(i) = count;
  }
};

/// Row i of CsrWeight::build_structure's row-pointer scan: row_map(i + 1) = Σ_{k <= i} counts(k).
template <class CountsView, class RowMapView> struct CsrRowMapScan {
  CountsView counts;
  RowMapView row_map;

  KOKKOS_INLINE_FUNCTION void operator()(const int i, int &sum, const bool final) const {
    sum += counts(i);
    if (final) {
      row_map(i + 1) = sum;
    }
  }
};

/// Row i of CsrWeight::build_structure's fill: the column indices and flat indices into W of
/// the active entries of row i of M, from row_map(i) on.
template <class RowMapView, class MaskView, class EntriesView, class FlatView> struct CsrFillRows {
  RowMapView row_map;
  int n;
  std::size_t si, sj;
  MaskView mask;
  EntriesView entries;
  FlatView flat;

  KOKKOS_INLINE_FUNCTION void operator()(const int i) const {
    int pos = row_map(i);
    for (int j = 0; j < n; ++j) {
      const std::size_t at = i * si + j * sj;
      if (mask(at) != 0) {
        entries(pos) = j;
        flat(pos) = int(at);
        ++pos;
      }
    }
  }
};

} // namespace detail

/// The active entries of a rows x cols weight matrix W, given by a 0/1 mask, as CSR matrices
/// that Kokkos Kernels multiplies (`KokkosSparse::spmv`), plus the products of a sparse
/// fully connected layer y = x Wᵀ built on them.
///
/// The mask and W are column-major like KAT's flat parameter buffer: entry (r, c) is
/// `r + rows * c`. build() records the structure (row pointers, column indices and each
/// entry's flat index) of W over its rows and, on first need (dx, dW), of Wᵀ over W's
/// columns. The values are not stored between calls: every product gathers them from W
/// first, O(nnz), so the flat parameter buffer stays the only copy of the weights an optimizer
/// updates.
///
/// The products take activations batch-major and column-major (x: N x cols, LayoutLeft).
/// Such an x is, in memory, xᵀ stored row-major (cols x N, LayoutRight), so y = x Wᵀ is
/// computed as yᵀ = W xᵀ, one `spmv` on LayoutRight multivectors, without a transpose.
/// Inputs or outputs whose columns are not contiguous (padded LayoutLeft views) are staged
/// through contiguous scratch matrices.
///
/// The sparse path pays off when few weights are active: the products cost O(N nnz), the dense
/// ones O(N rows cols) at GEMM speed (see default_sparse_crossover).
///
/// @tparam Scalar       float or double
/// @tparam MemorySpace  where the structure lives; kernels run on its execution space
template <class Scalar = float, class MemorySpace = DefaultMemorySpace> class CsrWeight {
public:
  using execution_space = typename MemorySpace::execution_space; ///< where the products run
  /// The execution and memory space pair Kokkos Kernels takes.
  using device_type = Kokkos::Device<execution_space, MemorySpace>;
  /// int column indices and row offsets: the types Kokkos Kernels and the vendor sparse
  /// libraries support everywhere; rows * cols must fit (checked).
  using crs_matrix_type = KokkosSparse::CrsMatrix<Scalar, int, device_type, void, int>;
  /// One byte per weight of W: 1 active, 0 masked.
  using mask_type = Kokkos::View<const std::uint8_t *, MemorySpace>;
  /// Int indices (offsets of the active weights in W).
  using index_view = Kokkos::View<int *, MemorySpace>;
  /// W, rows x cols, column-major and contiguous.
  using weight_type = Matrix<const Scalar, MemorySpace>;

  CsrWeight() = default;

  /// @throws ValueError if rows * cols does not fit in an int (the index type).
  CsrWeight(std::size_t rows, std::size_t cols)
      : rows_(rows), cols_(cols), in_scratch_("kat::sparse::CsrWeight::in"),
        out_scratch_("kat::sparse::CsrWeight::out") {
    if (rows != 0 && cols > std::size_t(INT_MAX) / rows) {
      throw ValueError(kat::detail::concat("kat::sparse::CsrWeight: rows * cols must be at most ",
                                           INT_MAX, " (int indices), got rows = ", rows,
                                           ", cols = ", cols));
    }
  }

  /// Rows of W (the layer's outputs).
  std::size_t rows() const { return rows_; }
  /// Columns of W (the layer's inputs).
  std::size_t cols() const { return cols_; }
  /// Whether build() has run since construction or reset().
  bool built() const { return built_; }
  /// Number of active entries (0 before build()).
  std::size_t nnz() const { return nnz_; }
  /// nnz / (rows * cols).
  double density() const {
    return rows_ * cols_ == 0 ? 0.0 : double(nnz_) / (double(rows_) * double(cols_));
  }

  /// Forgets the structure (and the mask it was built from).
  void reset() { *this = CsrWeight(rows_, cols_); }

  /// Records the structure of the entries with `active(r + rows * c) != 0`. O(rows * cols)
  /// work, one host read-back (the entry count). The mask view is kept (not copied) for the
  /// transposed structure, which is built on first need: it must not change until the next
  /// build() or reset().
  /// @throws ShapeError if active.extent(0) != rows * cols.
  void build(const execution_space &space, const mask_type &active) {
    kat::detail::require_extent("kat::sparse::CsrWeight::build", "active extent", rows_ * cols_,
                                active.extent(0));
    ScopedRegion region("kat::sparse::CsrWeight::build");
    mask_ = active;
    nnz_ = build_structure(space, false, matrix_, flat_);
    transposed_ = crs_matrix_type();
    flat_t_ = index_view();
    transposed_built_ = false;
    built_ = true;
  }

  /// Builds the structure of Wᵀ (cols x rows) if it is not there yet; multiply_transposed()
  /// and sampled_gradient() call it.
  void build_transposed(const execution_space &space) {
    require_built("build_transposed");
    if (transposed_built_) {
      return;
    }
    ScopedRegion region("kat::sparse::CsrWeight::build_transposed");
    build_structure(space, true, transposed_, flat_t_);
    transposed_built_ = true;
  }

  /// W over its rows (rows x cols), values as last gathered. For inspection and benchmarks.
  const crs_matrix_type &matrix() const { return matrix_; }
  /// Wᵀ (cols x rows), values as last gathered; empty until build_transposed().
  const crs_matrix_type &transposed_matrix() const { return transposed_; }

  /// Copies W's active entries into matrix()'s values (`transposed`: into
  /// transposed_matrix()'s, which must be built). The products call it.
  /// @param space       where the copy runs
  /// @param w           rows x cols, column-major and contiguous (a view of a flat buffer).
  /// @param transposed  false: into matrix(); true: into transposed_matrix()
  /// @throws ShapeError if w is not rows x cols with column stride rows.
  void gather(const execution_space &space, const weight_type &w, bool transposed = false) {
    require_built("gather");
    require_flat("gather", "w", w);
    const auto vals = transposed ? transposed_.values : matrix_.values;
    const auto flat = transposed ? flat_t_ : flat_;
    const Scalar *data = w.data();
    using gather_kernel =
        detail::CsrGather<typename crs_matrix_type::values_type, Scalar, index_view>;
    Kokkos::parallel_for("kat::sparse::CsrWeight::gather",
                         Kokkos::RangePolicy<execution_space>(space, 0, flat.extent(0)),
                         gather_kernel{vals, data, flat});
  }

  /// y = x Wᵀ + beta y, with W's values gathered from `w` first.
  /// @param space  where the product runs
  /// @param w      W, rows x cols, column-major and contiguous
  /// @param x      N x cols
  /// @param beta   the scale of y's old contents (0: overwritten)
  /// @param y      N x rows
  /// @throws ShapeError on mismatched extents or a w that is not flat (see gather()).
  void multiply(const execution_space &space, const weight_type &w,
                const Matrix<const Scalar, MemorySpace> &x, Scalar beta,
                const Matrix<Scalar, MemorySpace> &y) {
    ScopedRegion region("kat::sparse::CsrWeight::multiply");
    const char *where = "kat::sparse::CsrWeight::multiply";
    kat::detail::require_extent(where, "x columns", cols_, x.extent(1));
    kat::detail::require_extent(where, "y rows", x.extent(0), y.extent(0));
    kat::detail::require_extent(where, "y columns", rows_, y.extent(1));
    gather(space, w);
    apply(space, matrix_, x, beta, y);
  }

  /// dx = dy W + beta dx, with Wᵀ's values gathered from `w` first (building Wᵀ's structure on
  /// first use).
  /// @param space  where the product runs
  /// @param w      W, rows x cols, column-major and contiguous
  /// @param dy     N x rows
  /// @param beta   the scale of dx's old contents (0: overwritten)
  /// @param dx     N x cols
  /// @throws ShapeError on mismatched extents or a w that is not flat (see gather()).
  void multiply_transposed(const execution_space &space, const weight_type &w,
                           const Matrix<const Scalar, MemorySpace> &dy, Scalar beta,
                           const Matrix<Scalar, MemorySpace> &dx) {
    ScopedRegion region("kat::sparse::CsrWeight::multiply_transposed");
    const char *where = "kat::sparse::CsrWeight::multiply_transposed";
    kat::detail::require_extent(where, "dy columns", rows_, dy.extent(1));
    kat::detail::require_extent(where, "dx rows", dy.extent(0), dx.extent(0));
    kat::detail::require_extent(where, "dx columns", cols_, dx.extent(1));
    build_transposed(space);
    gather(space, w, true);
    apply(space, transposed_, dy, beta, dx);
  }

  /// The weight gradient dL/dW = dyᵀ x at the active entries only ("sampled" product,
  /// O(N nnz)): dW(r, c) = Σ_i dy(i, r) x(i, c) for active (r, c). Builds Wᵀ's structure on
  /// first use: the kernel walks W by columns, which keeps x's column in cache and dW's writes
  /// contiguous.
  ///
  /// `accumulate` false: overwrites dW, inactive entries become 0 (dW = mask ⊙ dyᵀx).
  /// `accumulate` true: adds at the active entries and leaves the inactive ones as they were
  /// (dW += mask ⊙ dyᵀx). Either way, this call's contribution is the masked gradient.
  /// @param space       where the kernel runs
  /// @param dy          N x rows
  /// @param x           N x cols
  /// @param dw          rows x cols, column-major and contiguous
  /// @param accumulate  add to dw's active entries instead of overwriting dw
  /// @throws ShapeError on mismatched extents or a dw that is not flat.
  void sampled_gradient(const execution_space &space, const Matrix<const Scalar, MemorySpace> &dy,
                        const Matrix<const Scalar, MemorySpace> &x,
                        const Matrix<Scalar, MemorySpace> &dw, bool accumulate) {
    ScopedRegion region("kat::sparse::CsrWeight::sampled_gradient");
    const char *where = "kat::sparse::CsrWeight::sampled_gradient";
    require_built("sampled_gradient");
    kat::detail::require_extent(where, "dy columns", rows_, dy.extent(1));
    kat::detail::require_extent(where, "x columns", cols_, x.extent(1));
    kat::detail::require_extent(where, "x rows", dy.extent(0), x.extent(0));
    require_flat("sampled_gradient", "dw", dw);
    build_transposed(space);
    using functor =
        detail::SampledGradient<execution_space, Scalar, decltype(transposed_.graph.row_map),
                                decltype(transposed_.graph.entries),
                                Matrix<const Scalar, MemorySpace>,
                                Matrix<const Scalar, MemorySpace>, Matrix<Scalar, MemorySpace>>;
    const functor f{
        transposed_.graph.row_map, transposed_.graph.entries, dy, x, dw, dy.extent(0), accumulate};
    using policy = Kokkos::TeamPolicy<execution_space>;
    if constexpr (detail::is_host_space_v<execution_space>) {
      Kokkos::parallel_for("kat::sparse::CsrWeight::sampled_gradient", policy(space, int(cols_), 1),
                           f);
    } else {
      // A thread per active entry of the column, 32 vector lanes over the batch.
      Kokkos::parallel_for("kat::sparse::CsrWeight::sampled_gradient",
                           policy(space, int(cols_), Kokkos::AUTO, 32), f);
    }
  }

  /// CSR structure of W (`transposed` false: rows x cols over W's rows) or Wᵀ (cols x rows):
  /// row pointers, column indices, each entry's flat index into W, zero values. Returns nnz.
  /// Public only because GPU compilers require kernels in public members.
  std::size_t build_structure(const execution_space &space, bool transposed, crs_matrix_type &out,
                              index_view &flat_out) const {
    // Logical matrix M (m x n): M = W, or M = Wᵀ whose entry (i, j) is W's (j, i). Its entry
    // (i, j) sits at mask index i * si + j * sj.
    const int m = int(transposed ? cols_ : rows_);
    const int n = int(transposed ? rows_ : cols_);
    const std::size_t si = transposed ? rows_ : 1;
    const std::size_t sj = transposed ? 1 : rows_;
    const auto mask = mask_;
    using row_map_type = typename crs_matrix_type::row_map_type::non_const_type;
    using entries_type = typename crs_matrix_type::index_type::non_const_type;
    using values_type = typename crs_matrix_type::values_type::non_const_type;
    index_view counts("kat::sparse::CsrWeight::counts", std::size_t(m));
    Kokkos::parallel_for("kat::sparse::CsrWeight::count",
                         Kokkos::RangePolicy<execution_space>(space, 0, m),
                         detail::CsrRowCounts<mask_type, index_view>{n, mask, si, sj, counts});
    row_map_type row_map("kat::sparse::CsrWeight::row_map", std::size_t(m) + 1);
    Kokkos::parallel_scan("kat::sparse::CsrWeight::row_map",
                          Kokkos::RangePolicy<execution_space>(space, 0, m),
                          detail::CsrRowMapScan<index_view, row_map_type>{counts, row_map});
    int nnz = 0;
    space.fence();
    Kokkos::deep_copy(nnz, Kokkos::subview(row_map, std::size_t(m)));
    entries_type entries(
        Kokkos::view_alloc(Kokkos::WithoutInitializing, "kat::sparse::CsrWeight::entries"),
        std::size_t(nnz));
    index_view flat(Kokkos::view_alloc(Kokkos::WithoutInitializing, "kat::sparse::CsrWeight::flat"),
                    std::size_t(nnz));
    values_type values("kat::sparse::CsrWeight::values", std::size_t(nnz));
    Kokkos::parallel_for("kat::sparse::CsrWeight::fill",
                         Kokkos::RangePolicy<execution_space>(space, 0, m),
                         detail::CsrFillRows<row_map_type, mask_type, entries_type, index_view>{
                             row_map, n, si, sj, mask, entries, flat});
    out = crs_matrix_type("kat::sparse::CsrWeight", m, n, nnz, values, row_map, entries);
    flat_out = flat;
    return std::size_t(nnz);
  }

private:
  using right_const = Kokkos::View<const Scalar **, Kokkos::LayoutRight, MemorySpace,
                                   Kokkos::MemoryTraits<Kokkos::Unmanaged>>;
  using right = Kokkos::View<Scalar **, Kokkos::LayoutRight, MemorySpace,
                             Kokkos::MemoryTraits<Kokkos::Unmanaged>>;

  /// Whether a LayoutLeft matrix has no padding between its columns.
  template <class View> static bool contiguous(const View &a) {
    return a.extent(1) <= 1 || std::size_t(a.stride(1)) == a.extent(0);
  }

  void require_built(const char *what) const {
    if (!built_) {
      throw ValueError(kat::detail::concat("kat::sparse::CsrWeight::", what,
                                           ": no structure; call build(space, active) first"));
    }
  }

  template <class View> void require_flat(const char *what, const char *arg, const View &a) const {
    const std::string where = std::string("kat::sparse::CsrWeight::") + what;
    kat::detail::require_extent(where.c_str(), (std::string(arg) + " rows").c_str(), rows_,
                                a.extent(0));
    kat::detail::require_extent(where.c_str(), (std::string(arg) + " columns").c_str(), cols_,
                                a.extent(1));
    if (!contiguous(a)) {
      throw ShapeError(
          kat::detail::concat(where, ": ", arg, " must be contiguous and column-major (strides 1, ",
                              rows_, "), got strides ", a.stride(0), ", ", a.stride(1)));
    }
  }

  /// A contiguous copy of `a` in `scratch`.
  static Matrix<const Scalar, MemorySpace> stage(const execution_space &space,
                                                 Workspace<Scalar, MemorySpace> &scratch,
                                                 const Matrix<const Scalar, MemorySpace> &a) {
    const auto copy = scratch.matrix(a.extent(0), a.extent(1));
    Kokkos::deep_copy(space, copy, a);
    return copy;
  }

  /// out = in Aᵀ + beta out (in: N x A.numCols(), out: N x A.numRows()), as the LayoutRight
  /// spmv outᵀ = A inᵀ.
  void apply(const execution_space &space, const crs_matrix_type &a,
             const Matrix<const Scalar, MemorySpace> &in, Scalar beta,
             const Matrix<Scalar, MemorySpace> &out) {
    const std::size_t n = in.extent(0);
    if (n == 0) {
      return;
    }
    const auto in_c = contiguous(in) ? in : stage(space, in_scratch_, in);
    const bool out_direct = contiguous(out);
    Matrix<Scalar, MemorySpace> out_c = out;
    if (!out_direct) {
      out_c = out_scratch_.matrix(n, out.extent(1));
      if (beta != Scalar(0)) {
        Kokkos::deep_copy(space, out_c, out);
      }
    }
    const right_const in_t(in_c.data(), in_c.extent(1), n);
    const right out_t(out_c.data(), out_c.extent(1), n);
#if KAT_KOKKOSSPARSE_HAS_SPACE_ARGUMENT
    KokkosSparse::spmv(space, "N", Scalar(1), a, in_t, beta, out_t);
#else
    kat::detail::on_default_instance(
        space, [&] { KokkosSparse::spmv("N", Scalar(1), a, in_t, beta, out_t); });
#endif
    if (!out_direct) {
      Kokkos::deep_copy(space, out, out_c);
    }
  }

  std::size_t rows_ = 0, cols_ = 0, nnz_ = 0;
  bool built_ = false, transposed_built_ = false;
  mask_type mask_;
  crs_matrix_type matrix_, transposed_;
  index_view flat_, flat_t_;
  Workspace<Scalar, MemorySpace> in_scratch_, out_scratch_;
};

} // namespace kat::sparse
