#pragma once
/// @file
/// @brief Internal: the status buffer of a kat::precond::KFAC step (its one read-back per step)
/// and the fused KL clip over the preconditioned layers.

#include "kat/core/host_sync.hpp"
#include "kat/core/views.hpp"
#include "kat/precond/detail/kfac_kernels.hpp"

#include <Kokkos_Core.hpp>

#include <algorithm>
#include <cstddef>
#include <vector>

namespace kat::detail {

/// The status of one KFAC step for `layers` registered layers, one double per slot, on the
/// device and read back once per step: Σ P ⊙ ∇ (vg_slot), the KL clip's ν (scale_slot), the
/// non-finite count of each staged factor (factor_slot(): A then G of each layer), each layer's
/// factored-preconditioning verdict (verdict_slot(): 0 passed, 1 failed) and its check's two
/// squared norms (check_slot()). Also runs the fused KL clip over the applied layers' segments.
template <class InverseScalar, class Scalar, class MemorySpace> class KFACStatus {
public:
  using execution_space = typename MemorySpace::execution_space;
  using view_type = Vector<double, MemorySpace>;
  using segment_type = PGSegment<InverseScalar, Scalar>;
  static constexpr std::size_t vg_slot = 0, scale_slot = 1;

  static std::size_t factor_slot(std::size_t layer, char which) {
    return 2 + 2 * layer + (which == 'G' ? 1 : 0);
  }
  std::size_t verdict_slot(std::size_t layer) const { return 2 + 2 * layers_ + layer; }
  std::size_t check_slot(std::size_t layer) const { return 2 + 3 * layers_ + 2 * layer; }

  /// The device buffer.
  const view_type &device() const { return status_; }
  /// Slot `slot` of the device buffer as a rank-0 view.
  auto at(std::size_t slot) const { return Kokkos::subview(status_, slot); }
  /// The host copy of the last read().
  const typename view_type::HostMirror &host() const { return host_; }
  /// Slot `slot` as last read back.
  double operator()(std::size_t slot) const { return host_(slot); }

  /// Zeroes the buffer for `layers` layers (allocated on first use, or when that changed).
  void clear(const execution_space &space, std::size_t layers) {
    layers_ = layers;
    const std::size_t n = verdict_slot(layers) + 2 * layers;
    if (status_.extent(0) != n) {
      status_ = view_type("kat::precond::KFAC::status", n);
      host_ = Kokkos::create_mirror_view(status_);
    }
    kat::detail::clear(space, status_);
  }

  /// Copies the buffer to the host: the one place a step waits for the device.
  void read(const execution_space &space) {
    Kokkos::deep_copy(space, host_, status_);
    kat::detail::fence(space);
  }

  /// In fused kernels over `segments` (the applied layers' P and ∇, in registration order;
  /// their `chunk` is set here): Σ P ⊙ ∇ into vg_slot, ν into scale_slot (kl_scale(): NaN when
  /// a failure was counted this step, from the factors' counts on, or with
  /// `keep_previous_on_failure` from the verdicts on), and ∇ = ν·P. The segments are copied
  /// to the device only when they changed (not in a steady state).
  void kl_clip(const execution_space &space, std::vector<segment_type> segments,
               bool keep_previous_on_failure, double kl_clip, double lr) {
    constexpr std::size_t chunk = fused_chunk<execution_space>;
    std::size_t chunks = 0;
    for (segment_type &seg : segments) {
      seg.chunk = chunks;
      chunks += (seg.n + chunk - 1) / chunk;
    }
    const bool same = segments.size() == segments_host_.extent(0) &&
                      std::equal(segments.begin(), segments.end(), segments_host_.data());
    if (!same) {
      segments_ = Kokkos::View<segment_type *, MemorySpace>(
          Kokkos::view_alloc("kat::precond::KFAC::segments", Kokkos::WithoutInitializing),
          segments.size());
      segments_host_ = Kokkos::create_mirror_view(segments_);
      std::copy(segments.begin(), segments.end(), segments_host_.data());
      Kokkos::deep_copy(space, segments_, segments_host_);
    }
    if (chunks > 0) {
      segment_dot(space, segments_, chunks, at(vg_slot));
    }
    // Without keep_previous_on_failure a non-finite factor fails the step; with it the
    // factor is only kept, so only the factored-preconditioning verdicts count.
    const std::size_t fail_begin = keep_previous_on_failure ? verdict_slot(0) : factor_slot(0, 'A');
    kl_scale(space, status_, vg_slot, scale_slot, fail_begin, verdict_slot(layers_), kl_clip, lr);
    if (chunks > 0) {
      segment_apply(space, segments_, chunks, at(scale_slot));
    }
  }

private:
  std::size_t layers_ = 0;
  view_type status_;
  typename view_type::HostMirror host_;
  Kokkos::View<segment_type *, MemorySpace> segments_;
  typename Kokkos::View<segment_type *, MemorySpace>::HostMirror segments_host_;
};

} // namespace kat::detail
