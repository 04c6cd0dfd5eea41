#pragma once
/// @file
/// @brief kat::optim::FOSIPartition: how kat::optim::FOSI's vectors are split over processes,
/// so that each keeps and updates one slice of the flat parameter vector (kat::distributed::DHO2
/// supplies one over MPI; without one, FOSI holds everything).

#include "kat/core/error.hpp"
#include "kat/core/lanczos.hpp"
#include "kat/core/views.hpp"

#include <cstddef>
#include <cstdint>
#include <optional>

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
  using execution_space =
      typename MemorySpace::execution_space;              ///< where the collectives' kernels run
  using vector_type = kat::Vector<Scalar, MemorySpace>;   ///< a slice of a Scalar n-vector
  using double_vector = kat::Vector<double, MemorySpace>; ///< a slice of a double n-vector

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

  // --- asynchronous estimation (DHO2 with curvature ranks) ------------------------------

  /// Whether the curvature is estimated elsewhere while this process trains: then, at a
  /// refresh step, FOSI calls start_estimate() instead of lanczos() and keeps stepping with the
  /// previous estimate until finish_estimate() returns the new one, at most
  /// staleness_bound() steps later. False by default (lanczos() runs synchronously).
  virtual bool asynchronous() const { return false; }

  /// The most steps between start_estimate() and the step that first uses its result (0: the
  /// step that starts an estimate waits for it). Meaningful when asynchronous().
  virtual std::int64_t staleness_bound() const { return 0; }

  /// Starts an estimate with `options` at `params` (length global_size(), the whole vector,
  /// as every process holds it at the start of a step) and returns without waiting for it.
  /// Collective. At most one estimate is in flight: FOSI finishes one before starting the next.
  /// @throws Error unless asynchronous().
  virtual void start_estimate(const execution_space &space, const vector_type &params,
                              const LanczosOptions &options) {
    (void)space;
    (void)params;
    (void)options;
    throw Error("kat::optim::FOSIPartition::start_estimate: this partition estimates "
                "synchronously (asynchronous() is false)");
  }

  /// The estimate started last, in lanczos()'s layout, once every process has it; empty while
  /// any has not (or, by the partition's policy, before the bound). With `wait`, blocks until
  /// it is there. Collective: every process gets the same answer at the same step.
  /// @throws Error unless asynchronous(), or if the estimate failed where it ran.
  virtual std::optional<LanczosResult<MemorySpace>> finish_estimate(const execution_space &space,
                                                                    bool wait) {
    (void)space;
    (void)wait;
    throw Error("kat::optim::FOSIPartition::finish_estimate: this partition estimates "
                "synchronously (asynchronous() is false)");
  }

  /// Wall seconds of the Lanczos run behind the last result of finish_estimate(), measured
  /// where it ran; 0 before.
  virtual double estimate_seconds() const { return 0.0; }
};

} // namespace optim
} // namespace kat
