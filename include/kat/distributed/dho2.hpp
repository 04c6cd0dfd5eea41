#pragma once
/// @file
/// @brief kat::distributed::DHO2: distributed FOSI with sharded curvature and partial-curvature
/// updates (Gu et al., "DHO2", arXiv 2505.00982; reference code ShunxianGu/DHO2). Needs KAT
/// built with `-DKAT_ENABLE_MPI=ON`.

#ifndef KAT_ENABLE_MPI
// KAT::kat defines KAT_ENABLE_MPI and links MPI::MPI_CXX when configured with MPI.
#error "kat/distributed/dho2.hpp needs MPI: configure KAT with -DKAT_ENABLE_MPI=ON"
#else

#include "kat/core/error.hpp"
#include "kat/core/lanczos.hpp"
#include "kat/core/views.hpp"
#include "kat/distributed/communicator.hpp"
#include "kat/distributed/parameter_shard.hpp"
#include "kat/distributed/sharded_lanczos.hpp"
#include "kat/optim/fosi.hpp"
#include "kat/optim/fosi_partition.hpp"

#include <Kokkos_Core.hpp>

#include <cstddef>
#include <memory>
#include <utility>

namespace kat::distributed {
namespace detail {

/// FOSI's vectors split by ParameterShard over the ranks of a communicator: projections are
/// all-reduced (k + l)-vectors, Lanczos is sharded_lanczos, and the parameters are
/// re-assembled by one all-gather of the padded slices.
template <class Scalar, class MemorySpace>
class DHO2Partition : public kat::optim::FOSIPartition<Scalar, MemorySpace> {
  using Base = kat::optim::FOSIPartition<Scalar, MemorySpace>;

public:
  using typename Base::double_vector;
  using typename Base::execution_space;
  using typename Base::vector_type;

  DHO2Partition(std::shared_ptr<Communicator> comm, const ParameterShard &shard)
      : comm_(std::move(comm)), shard_(shard),
        slice_("kat::distributed::DHO2::slice", shard.padded),
        whole_("kat::distributed::DHO2::gathered", shard.padded * shard.ranks) {}

  std::size_t global_size() const override { return shard_.n; }
  std::size_t offset() const override { return shard_.offset; }
  std::size_t local_size() const override { return shard_.size; }
  std::size_t vector_length() const override { return shard_.padded; }

  void sum(const execution_space &space, const double_vector &coefficients) override {
    comm_->allreduce(space, coefficients);
  }

  LanczosResult<MemorySpace> lanczos(const execution_space &space,
                                     const LinearOperator<MemorySpace> &op,
                                     const LanczosOptions &options) override {
    return sharded_lanczos<MemorySpace>(space, *comm_, op, shard_, options);
  }

  void gather(const execution_space &space, const vector_type &params) override {
    const auto mine = std::make_pair(shard_.offset, shard_.offset + shard_.size);
    Kokkos::deep_copy(space, Kokkos::subview(slice_, std::make_pair(std::size_t(0), shard_.size)),
                      Kokkos::subview(params, mine));
    comm_->allgather(space, slice_, whole_);
    Kokkos::deep_copy(space, params,
                      Kokkos::subview(whole_, std::make_pair(std::size_t(0), shard_.n)));
  }

  Communicator &communicator() const { return *comm_; }
  const ParameterShard &shard() const { return shard_; }

private:
  std::shared_ptr<Communicator> comm_;
  ParameterShard shard_;
  vector_type slice_; // padded; the padding stays zero
  vector_type whole_; // ranks x padded
};

} // namespace detail

/// DHO2 (Gu et al., arXiv 2505.00982): FOSI (kat::optim::FOSI, ALGORITHMS.md §3) on P ranks
/// with its curvature sharded, so curvature memory and work per rank fall as 1/P.
///
/// Rank r owns the contiguous slice parameter_shard(n, r, P) of the flat parameter vector
/// (padded to ⌈n/P⌉) and keeps only that slice of everything FOSI keeps per parameter:
///
/// - the Lanczos basis and the Ritz vectors (sharded_lanczos: dot products and
///   re-orthogonalization coefficients are all-reduced, the tridiagonal problem is solved on
///   every rank);
/// - V, the subspace momentum and the base optimizer's state (the base optimizer is built for
///   the slice, `shard().size` entries: ZeRO-1-style sharding of its moments).
///
/// A step (every rank has the whole averaged gradient g, as after data-parallel averaging):
/// V g = Σ_r V_r g_r is one all-reduce of a (k + l)-vector, the rank computes the Newton and
/// complement updates of its slice (the base step on its slice of g2), V u is a second
/// (k + l) all-reduce, and the updated slices are all-gathered into every rank's parameters.
/// Per step and rank that is 16 (k + l) + ⌈n/P⌉ sizeof(Scalar) bytes (step_bytes()), against
/// the n-entry gradient all-reduce of the data parallelism around it.
///
/// The curvature operator maps this rank's slice (length shard().padded) to its slice of
/// H v; sharded_curvature_operator builds the Hessian of the mean loss over every rank's own
/// curvature batch. The reference code instead computes every product redundantly from rank
/// 0's broadcast batch, rebuilds vectors with full-length all-reduces and reassembles the
/// whole k x n eigenvectors on every rank (ALGORITHMS.md §4).
///
/// With equal inputs (parameters, averaged gradients, and an operator equal to FOSI's), a
/// DHO2 step equals FOSI's on one process up to the rounding of the reductions. On one rank
/// it is FOSI with two no-op all-reduces and a copy. Estimation here is synchronous: every
/// rank takes part in each refresh.
///
/// DHO2 communicates on a duplicate of the communicator it is given (its own counters:
/// stats()). Construction and every step() and refresh() are collective. The state
/// (state_dict()) is this rank's slice: save and load one per rank.
template <class Scalar = float, class MemorySpace = kat::DefaultMemorySpace>
class DHO2 : public kat::optim::FOSI<Scalar, MemorySpace> {
  using FOSI = kat::optim::FOSI<Scalar, MemorySpace>;
  using Partition = detail::DHO2Partition<Scalar, MemorySpace>;

public:
  using typename FOSI::base_type;
  using typename FOSI::operator_type;
  using Options = typename FOSI::Options;

  /// DHO2 over the ranks of `comm` for a flat parameter vector of length n. `base` must be
  /// built for this rank's slice (size parameter_shard(n, comm.rank(), comm.size()).size) and
  /// `curvature` must map this rank's padded slice to its slice of the product (see
  /// sharded_operator). Options as FOSI's, the same on every rank.
  /// @throws ValueError from parameter_shard (too few parameters for the ranks) and as FOSI's
  ///   constructor (which names base->size() when it is not the slice's size).
  DHO2(Communicator &comm, std::size_t n, std::unique_ptr<base_type> base, operator_type curvature,
       const Options &options)
      : DHO2(std::make_shared<Partition>(std::make_shared<Communicator>(comm.dup()),
                                         parameter_shard(n, comm.rank(), comm.size())),
             n, std::move(base), std::move(curvature), options) {}

  std::string name() const override { return "DHO2"; }

  /// This rank's slice of the parameter vector.
  const ParameterShard &shard() const { return partition_->shard(); }

  /// What this rank passed to MPI on DHO2's own communicator (the Lanczos reductions, the
  /// projections and the gathers; not what the curvature operator sends on its own).
  CommunicatorStats stats() const { return partition_->communicator().stats(); }
  void reset_stats() { partition_->communicator().reset_stats(); }

  /// Payload bytes per rank of one step without a refresh: the all-gather of the padded slice
  /// (⌈n/P⌉ Scalars), plus with an estimate (`estimated`) the two (k + l)-double all-reduces.
  std::size_t step_bytes(bool estimated) const {
    const std::size_t gather = shard().padded * sizeof(Scalar);
    return estimated ? gather + 2 * sizeof(double) * (this->options().k + this->options().l)
                     : gather;
  }

  /// Payload bytes per rank of one refresh on DHO2's communicator: sharded_lanczos's
  /// reductions (8 (m² + m)) and the all-reduce of V m (8 (k + l)); the operator's own
  /// communication (sharded_operator: 4 + (P + 1) ⌈n/P⌉ sizeof(Scalar) per product, m
  /// products) is not included.
  std::size_t refresh_bytes() const {
    const auto &o = this->options();
    return sharded_lanczos_bytes(o.lanczos_iterations) + sizeof(double) * (o.k + o.l);
  }

private:
  DHO2(std::shared_ptr<Partition> partition, std::size_t n, std::unique_ptr<base_type> base,
       operator_type curvature, const Options &options)
      : FOSI(n, std::move(base), std::move(curvature), options, partition),
        partition_(std::move(partition)) {}

  std::shared_ptr<Partition> partition_;
};

} // namespace kat::distributed

#endif
