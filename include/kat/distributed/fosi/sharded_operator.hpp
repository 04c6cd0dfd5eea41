#pragma once
/// @file
/// @brief kat::distributed::sharded_operator: a linear operator on sharded vectors that is the
/// mean of per-rank products, such as the Hessian of a global mean loss from each rank's own
/// data shard (DHO2, Gu et al., arXiv 2505.00982, Sec. 3). Needs KAT built with
/// `-DKAT_ENABLE_MPI=ON`.

#ifndef KAT_ENABLE_MPI
// KAT::kat defines KAT_ENABLE_MPI and links MPI::MPI_CXX when configured with MPI.
#error "kat/distributed/fosi/sharded_operator.hpp needs MPI: configure KAT with -DKAT_ENABLE_MPI=ON"
#else

#include "kat/core/error.hpp"
#include "kat/core/lanczos.hpp"
#include "kat/core/views.hpp"
#include "kat/distributed/comm/communicator.hpp"
#include "kat/distributed/fosi/parameter_shard.hpp"
#include "kat/nn/hessian_vector_product.hpp"

#include <Kokkos_Core.hpp>

#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <utility>

namespace kat::distributed {
namespace detail {

/// to(i) = scale * from(i) in double (scale_to_double). A named functor rather than an
/// extended device lambda: nvcc's wrapper of an extended lambda in a header is merged across
/// translation units while its function pointers are not (docs/backends.md).
template <class From, class To> struct ScaleToDouble {
  From from;
  double scale;
  To to;

  KOKKOS_INLINE_FUNCTION void operator()(const std::size_t i) const {
    to(i) = scale * static_cast<double>(from(i));
  }
};

/// to(i) = scale * from(i) in double.
template <class ExecSpace, class From, class To>
void scale_to_double(const ExecSpace &space, const From &from, double scale, const To &to) {
  Kokkos::parallel_for("kat::distributed::sharded_operator::scale",
                       Kokkos::RangePolicy<ExecSpace>(space, 0, to.extent(0)),
                       ScaleToDouble<From, To>{from, scale, to});
}

} // namespace detail

/// One rank's product: out = A_r v for the whole n-vector v (both length n, Scalar, in
/// MemorySpace; out holds zeros on entry and does not alias v).
template <class Scalar, class MemorySpace>
using LocalProduct = std::function<void(const typename MemorySpace::execution_space &space,
                                        const Vector<Scalar, MemorySpace> &v,
                                        const Vector<Scalar, MemorySpace> &out)>;

/// A kat::LinearOperator on sharded vectors (see sharded_lanczos) that applies
/// A = (1/P) Σ_r A_r, where rank r of the P ranks of `comm` computes A_r v with `product`. Each
/// application:
///
/// 1. converts this rank's slice of v to Scalar and all-gathers the slices (shard.padded
///    Scalars per rank) into the whole v;
/// 2. runs `product` on the whole v; an exception there is caught and the ranks agree on
///    whether any failed (one all-reduced int32), so a failure on one rank throws Error on
///    every rank, naming the lowest failing rank and, on that rank, its message, instead of
///    leaving the others waiting in the next collective;
/// 3. sums the products over the ranks with one reduce-scatter (P · shard.padded Scalars per
///    rank), so each rank receives only its slice, and scales it by 1/P into the double out.
///
/// With A_r the Hessian of rank r's mean loss on its own batch of equal size, A is the Hessian
/// of the mean loss over all ranks' batches (sharded_curvature_operator). Per application each
/// rank passes 4 + (P + 1) · shard.padded · sizeof(Scalar) bytes to MPI.
///
/// The operator keeps `comm` by reference (it must outlive the operator) and four
/// P · shard.padded Scalar buffers. Collective: every rank applies it at the same time.
/// @throws ValueError if shard does not belong to comm or product is empty.
template <class Scalar, class MemorySpace>
kat::LinearOperator<MemorySpace> sharded_operator(Communicator &comm, const ParameterShard &shard,
                                                  LocalProduct<Scalar, MemorySpace> product) {
  const char *who = "kat::distributed::sharded_operator";
  if (shard.ranks != comm.size() || shard.rank != comm.rank()) {
    throw ValueError(kat::detail::concat(who, ": shard must be rank ", comm.rank(), " of ",
                                         comm.size(), " (the communicator's), got rank ",
                                         shard.rank, " of ", shard.ranks));
  }
  if (!product) {
    throw ValueError(kat::detail::concat(who, ": product must be callable, got an empty one"));
  }
  using vector_type = Vector<Scalar, MemorySpace>;
  struct State {
    Communicator *comm;
    ParameterShard shard;
    LocalProduct<Scalar, MemorySpace> product;
    vector_type slice, whole, products, reduced;
    Kokkos::View<std::int32_t *, Kokkos::HostSpace> failed;
  };
  const std::size_t all = shard.padded * static_cast<std::size_t>(shard.ranks);
  auto state = std::make_shared<State>(
      State{&comm, shard, std::move(product),
            vector_type("kat::distributed::sharded_operator::slice", shard.padded),
            vector_type("kat::distributed::sharded_operator::whole", all),
            vector_type("kat::distributed::sharded_operator::products", all),
            vector_type("kat::distributed::sharded_operator::reduced", shard.padded),
            Kokkos::View<std::int32_t *, Kokkos::HostSpace>("kat::distributed::failed", 1)});
  return [state](const typename MemorySpace::execution_space &space,
                 const Kokkos::View<const double *, MemorySpace> &v,
                 const Kokkos::View<double *, MemorySpace> &out) {
    State &s = *state;
    kat::nn::detail::convert_vector(space, v, s.slice);
    s.comm->allgather(space, s.slice, s.whole);
    Kokkos::deep_copy(space, s.products, Scalar(0));
    const auto range = std::make_pair(std::size_t(0), s.shard.n);
    std::string error;
    try {
      s.product(space, Kokkos::subview(s.whole, range), Kokkos::subview(s.products, range));
      space.fence();
    } catch (const std::exception &e) {
      error = e.what();
    }
    const int ranks = s.shard.ranks;
    s.failed(0) = error.empty() ? ranks : s.shard.rank;
    s.comm->allreduce(Kokkos::DefaultHostExecutionSpace(), s.failed, ReduceOp::min);
    if (s.failed(0) < ranks) {
      throw Error(kat::detail::concat(
          "kat::distributed::sharded_operator: the product failed on rank ", s.failed(0), " of ",
          ranks, error.empty() ? " (its message is on that rank)" : ": " + error));
    }
    s.comm->reduce_scatter(space, s.products, s.reduced);
    detail::scale_to_double(space, s.reduced, 1.0 / static_cast<double>(ranks), out);
  };
}

/// The Hessian (or Gauss-Newton matrix) of the mean loss over every rank's batch as a
/// sharded operator: rank r's product is kat::nn::CurvatureVectorProduct on its own batch
/// (x, targets), the ranks' batches of equal size, so A = (1/P) Σ_r H_r is the curvature of
/// the loss on their concatenation — each rank differentiates only its own data, unlike a
/// single batch broadcast from one rank and recomputed everywhere. See sharded_operator for
/// the communication, kat::nn::curvature_operator for what is kept (x and targets must stay
/// unchanged; `model` must outlive the operator) and for the model's mode during products.
/// @throws as sharded_operator; when applied, as CurvatureVectorProduct::apply (on every rank,
///   through sharded_operator's agreement).
template <class Scalar, class MemorySpace, class Loss, class Targets>
kat::LinearOperator<MemorySpace>
sharded_curvature_operator(Communicator &comm, const ParameterShard &shard,
                           kat::nn::Sequential<Scalar, MemorySpace> &model, const Loss &loss,
                           const Matrix<Scalar, MemorySpace> &x, const Targets &targets,
                           kat::nn::CurvatureProduct kind = kat::nn::CurvatureProduct::hessian) {
  auto product = std::make_shared<kat::nn::CurvatureVectorProduct<Scalar, MemorySpace, Loss>>(kind);
  kat::nn::Sequential<Scalar, MemorySpace> *m = &model;
  return sharded_operator<Scalar, MemorySpace>(
      comm, shard,
      [product, m, loss, x, targets](const typename MemorySpace::execution_space &space,
                                     const Vector<Scalar, MemorySpace> &v,
                                     const Vector<Scalar, MemorySpace> &out) {
        product->apply(space, *m, loss, x, targets, v, out);
      });
}

} // namespace kat::distributed

#endif
