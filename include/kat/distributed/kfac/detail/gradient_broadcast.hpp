#pragma once
/// @file
/// @brief Internal: the broadcast of a preconditioned gradient in the model's precision,
/// shared by the strategies that share P (DP-KFAC, KAISA MEM-OPT and HYBRID-OPT).

#ifndef KAT_ENABLE_MPI
#error                                                                                             \
    "kat/distributed/kfac/detail/gradient_broadcast.hpp needs MPI: configure KAT with -DKAT_ENABLE_MPI=ON"
#else

#include "kat/core/detail/convert.hpp"
#include "kat/core/views.hpp"
#include "kat/core/workspace.hpp"
#include "kat/distributed/comm/communicator.hpp"

#include <cstddef>
#include <string>
#include <type_traits>
#include <utility>

namespace kat::distributed::detail {

/// Broadcasts preconditioned gradients P (InverseScalar) from a root, in the model's Scalar
/// when `model_precision` and the two types differ: the root rounds its P into a Scalar
/// staging buffer, the buffer is broadcast, and every rank, the root included, converts it
/// back over its P, so every rank holds, applies and computes the KL clip from the same
/// rounded P. Otherwise P is broadcast as it is.
///
/// @tparam Scalar       the model's scalar.
/// @tparam MemorySpace  where P lives.
template <class Scalar, class MemorySpace> class GradientBroadcast {
public:
  /// @param model_precision  broadcast in Scalar (see the class).
  /// @param label            the staging buffer's label.
  GradientBroadcast(bool model_precision, std::string label)
      : model_precision_(model_precision), narrow_(std::move(label)) {}

  /// Whether P of element type InverseScalar travels as Scalar.
  template <class InverseScalar> bool narrows() const {
    return model_precision_ && !std::is_same<Scalar, InverseScalar>::value;
  }

  /// The bytes of one broadcast of an out x cols P of element type InverseScalar.
  template <class InverseScalar> std::size_t bytes(std::size_t entries) const {
    return entries * (narrows<InverseScalar>() ? sizeof(Scalar) : sizeof(InverseScalar));
  }

  /// Leaves `root`'s P in `p` (out x cols, LayoutLeft, contiguous) on every rank of `comm`.
  /// Collective on `comm`. @throws MPIError from the broadcast.
  template <class ExecSpace, class PView>
  void broadcast(const ExecSpace &space, Communicator &comm, const PView &p, int root) {
    using InverseScalar = typename PView::non_const_value_type;
    if (!narrows<InverseScalar>()) {
      comm.broadcast(space, p, root);
      return;
    }
    const Matrix<Scalar, MemorySpace> q = narrow_.matrix(p.extent(0), p.extent(1));
    if (comm.rank() == root) {
      kat::detail::convert(space, p, q);
    }
    comm.broadcast(space, q, root);
    kat::detail::convert(space, q, p); // the root too: the same rounded P everywhere
  }

  /// Bytes of the Scalar staging buffer (0 until the first narrowed broadcast).
  std::size_t workspace_bytes() const { return narrow_.capacity() * sizeof(Scalar); }

private:
  bool model_precision_;
  Workspace<Scalar, MemorySpace> narrow_;
};

} // namespace kat::distributed::detail

#endif // KAT_ENABLE_MPI
