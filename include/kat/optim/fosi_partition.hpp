#pragma once
/// @file
/// @brief kat::optim::FOSIPartition: how kat::optim::FOSI's vectors are split over processes,
/// so that each keeps and updates one slice of the flat parameter vector (kat::distributed::DHO2
/// supplies one over MPI; without one, FOSI holds everything).

#include "kat/core/lanczos.hpp"
#include "kat/core/views.hpp"

#include <cstddef>

namespace kat {
namespace optim {

/// The split of FOSI's n-vectors into contiguous slices, one per process, and the three
/// collective operations FOSI needs across them (DHO2, Gu et al., arXiv 2505.00982, Sec. 3):
///
/// - sum(): V g = Σ_p V_p g_p, where V_p is the process's rows of the eigenvector basis, so a
///   projection onto the k + l eigenvectors is one all-reduce of a (k + l)-vector;
/// - lanczos(): the curvature estimate with the Lanczos basis and Ritz vectors sharded like the
///   parameters;
/// - gather(): the whole parameter vector from every process's updated slice.
///
/// Every call is collective: all processes make it, in the same order.
template <class Scalar, class MemorySpace> class FOSIPartition {
public:
  using execution_space = typename MemorySpace::execution_space;
  using vector_type = kat::Vector<Scalar, MemorySpace>;
  using double_vector = kat::Vector<double, MemorySpace>;

  virtual ~FOSIPartition() = default;

  /// n, the length of the whole flat parameter vector.
  virtual std::size_t global_size() const = 0;
  /// Index of the first entry of this process's slice in the flat vector.
  virtual std::size_t offset() const = 0;
  /// Number of entries of this process's slice, >= 1.
  virtual std::size_t local_size() const = 0;
  /// Length of the vectors the curvature operator and lanczos() work on on this process:
  /// local_size() plus any padding.
  virtual std::size_t vector_length() const = 0;

  /// In place: `coefficients` becomes the sum over the processes of their `coefficients`.
  virtual void sum(const execution_space &space, const double_vector &coefficients) = 0;

  /// The k largest and l smallest eigenpairs of the curvature operator `op` (as kat::lanczos),
  /// whose vectors are this process's slices in the layout the partition defines. The result's
  /// eigenvectors hold at least local_size() rows; the first local_size() are this process's
  /// slice of the Ritz vectors (the rest, padding, are zero).
  virtual LanczosResult<MemorySpace> lanczos(const execution_space &space,
                                             const LinearOperator<MemorySpace> &op,
                                             const LanczosOptions &options) = 0;

  /// `params` (length n) holds this process's updated slice; afterwards it holds every
  /// process's, on every process.
  virtual void gather(const execution_space &space, const vector_type &params) = 0;
};

} // namespace optim
} // namespace kat
