#pragma once
/// @file
/// @brief kat::distributed::sharded_lanczos: kat::lanczos with the Krylov basis and the Ritz
/// vectors sharded over the ranks of a Communicator (DHO2, Gu et al., arXiv 2505.00982, Sec. 3).
/// Needs KAT built with `-DKAT_ENABLE_MPI=ON`.

#ifndef KAT_ENABLE_MPI
// KAT::kat defines KAT_ENABLE_MPI and links MPI::MPI_CXX when configured with MPI.
#error "kat/distributed/fosi/sharded_lanczos.hpp needs MPI: configure KAT with -DKAT_ENABLE_MPI=ON"
#else

#include "kat/core/error.hpp"
#include "kat/core/lanczos.hpp"
#include "kat/distributed/comm/communicator.hpp"
#include "kat/distributed/fosi/parameter_shard.hpp"

#include <Kokkos_Core.hpp>

#include <cstddef>

namespace kat::distributed {
namespace detail {

/// kat::lanczos's reductions over the ranks of `comm`, each holding one ParameterShard: dot
/// products are all-reduced scalars and the re-orthogonalization coefficients all-reduced
/// (j + 1)-vectors.
class ShardedLanczosReduction {
public:
  ShardedLanczosReduction(Communicator &comm, const ParameterShard &shard)
      : comm_(&comm), shard_(shard), scalar_("kat::distributed::sharded_lanczos::scalar", 1) {}

  std::size_t global_size() const { return shard_.n; }
  std::size_t offset() const { return shard_.offset; }
  std::size_t valid_size() const { return shard_.size; }

  double sum(double local) const {
    scalar_(0) = local;
    comm_->allreduce(Kokkos::DefaultHostExecutionSpace(), scalar_);
    return scalar_(0);
  }

  template <class ExecSpace, class View> void sum(const ExecSpace &space, const View &v) const {
    comm_->allreduce(space, v);
  }

private:
  Communicator *comm_;
  ParameterShard shard_;
  Kokkos::View<double *, Kokkos::HostSpace> scalar_;
};

} // namespace detail

/// The k largest and l smallest eigenpairs of a symmetric operator on R^n whose vectors are
/// sharded over the ranks of `comm`: each rank holds the slice `shard` (length shard.padded,
/// zero past shard.size) of every vector, and `op` maps this rank's slice of v to its slice of
/// A v (communicating inside as it needs; kat::distributed::sharded_operator builds one from
/// per-rank products). The algorithm is kat::lanczos's (m iterations, full
/// re-orthogonalization by classical Gram-Schmidt twice, in double, the same start vector
/// entry for entry), with every reduction completed across the ranks:
///
/// - each dot product (α_j, β_j, the start norm) is one all-reduced double;
/// - each Gram-Schmidt pass all-reduces the (j + 1) coefficients Q_jᵀ w;
/// - the m x m tridiagonal problem is solved on every rank (its inputs are all-reduced, so
///   identical everywhere).
///
/// So each rank keeps only shard.padded x m basis entries and shard.padded x (k + l) Ritz
/// vector entries, ~1/P of kat::lanczos's, and the reductions send 8 (m² + m) bytes per rank
/// over a run of m iterations (CommunicatorStats::allreduce), besides what `op` sends. The
/// result equals kat::lanczos on the gathered operator up to the rounding of the reductions.
///
/// Collective: every rank of `comm` calls it with the same options.
/// @returns eigenvalues as kat::lanczos (identical on every rank) and this rank's rows of the
///   Ritz vectors (shard.padded x (k + l), rows past shard.size zero).
/// @throws ValueError if shard does not belong to comm (ranks or rank differ), and as
///   kat::lanczos (argument checks use n = shard.n); NumericalError as kat::lanczos, on every
///   rank alike, since it tests the all-reduced values.
template <class MemorySpace>
LanczosResult<MemorySpace>
sharded_lanczos(const typename MemorySpace::execution_space &space, Communicator &comm,
                const LinearOperator<MemorySpace> &op, const ParameterShard &shard,
                const LanczosOptions &options) {
  if (shard.ranks != comm.size() || shard.rank != comm.rank()) {
    throw ValueError(kat::detail::concat(
        "kat::distributed::sharded_lanczos: shard must be rank ", comm.rank(), " of ", comm.size(),
        " (the communicator's), got rank ", shard.rank, " of ", shard.ranks));
  }
  return kat::detail::lanczos_with<linalg::detail::LapackTridiagonalEigen, MemorySpace>(
      space, op, shard.padded, options, detail::ShardedLanczosReduction(comm, shard));
}

/// The analytic payload (CommunicatorStats bytes) that sharded_lanczos's own reductions send
/// per rank in a run of m iterations without breakdown: 8 (m² + m) bytes (one double for the
/// start norm, α_j for each j, β_j and 2 (j + 1) coefficients for j < m - 1).
inline std::size_t sharded_lanczos_bytes(std::size_t m) { return 8 * (m * m + m); }

} // namespace kat::distributed

#endif
