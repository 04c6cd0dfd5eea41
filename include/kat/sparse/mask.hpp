#pragma once
/// @file
/// @brief kat::sparse::Mask: binary masks over the weight tensors of one flat parameter buffer.

#include "kat/core/error.hpp"
#include "kat/core/random.hpp"
#include "kat/core/state.hpp"
#include "kat/core/views.hpp"
#include "kat/nn/layer.hpp"
#include "kat/optim/optimizer.hpp"
#include "kat/sparse/density.hpp"

#include <Kokkos_Core.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

namespace kat::sparse {

using nn::ParameterRole;
using nn::ParameterSpec;

/// The tensors a sparse network masks by default: the weights (ParameterRole::weight) with two
/// or more dimensions — Dense and Conv2d weights. Biases and BatchNorm's scale and shift stay
/// dense, as in the RigL and SET references.
inline std::vector<ParameterSpec> default_masked_tensors(const std::vector<ParameterSpec> &specs) {
  std::vector<ParameterSpec> out;
  for (const auto &s : specs) {
    if (s.role == ParameterRole::weight && s.shape.size() >= 2) {
      out.push_back(s);
    }
  }
  return out;
}

namespace detail {

// The kernels below are named functors, not extended device lambdas: nvcc's wrapper of an
// extended lambda in a header is merged across translation units while its function pointers
// are not (issue 31, docs/backends.md).

/// Entry i of apply_mask(): v(i) = 0 if active(i) == 0.
template <class V, class M> struct MaskApply {
  using value = typename V::non_const_value_type;
  M active;
  V v;

  KOKKOS_INLINE_FUNCTION void operator()(const std::size_t i) const {
    if (active(i) == 0) {
      v(i) = value(0);
    }
  }
};

/// Entry k of zero_at(): v(index(k)) = 0.
template <class V, class I> struct MaskZeroAt {
  using value = typename V::non_const_value_type;
  V v;
  I index;

  KOKKOS_INLINE_FUNCTION void operator()(const std::size_t k) const { v(index(k)) = value(0); }
};

/// v(i) = 0 wherever active(i) == 0; v and active of the same length.
template <class ExecSpace, class V, class M>
void apply_mask(const ExecSpace &space, const V &v, const M &active) {
  Kokkos::parallel_for("kat::sparse::Mask::apply",
                       Kokkos::RangePolicy<ExecSpace>(space, 0, v.extent(0)),
                       MaskApply<V, M>{active, v});
}

/// v(index(k)) = 0 for every k.
template <class ExecSpace, class V, class I>
void zero_at(const ExecSpace &space, const V &v, const I &index) {
  Kokkos::parallel_for("kat::sparse::Mask::zero_at",
                       Kokkos::RangePolicy<ExecSpace>(space, 0, index.extent(0)),
                       MaskZeroAt<V, I>{v, index});
}

} // namespace detail

/// Binary masks over some tensors of a flat parameter vector of length n (a model's
/// `parameters()`; the tensors are its `parameter_specs()` entries, by default
/// default_masked_tensors()). Entry i of the flat mask is 1 when parameter i is active; every
/// entry outside the masked tensors is 1, so one kernel over n masks the parameters, the
/// gradients and the optimizer state alike.
///
/// The mask lives on the device (active(), for kernels) and on the host (host(), for the
/// selections of SET and RigL, which change it every ΔT steps); set() keeps both equal.
/// Section 5 of the methods notes: a masked weight, and its optimizer state, stay exactly 0.
template <class Scalar = float, class MemorySpace = kat::DefaultMemorySpace> class Mask {
public:
  using execution_space = typename MemorySpace::execution_space; ///< where the masking kernels run
  using vector_type = kat::Vector<Scalar, MemorySpace>; ///< a flat n-vector (parameters, gradients,
                                                        ///< optimizer state)
  using mask_type =
      Kokkos::View<std::uint8_t *, MemorySpace>; ///< one byte per entry: 1 active, 0 masked

  /// All entries active.
  /// @param n       the flat parameter vector's length
  /// @param tensors the masked tensors; each must lie in [0, n) and not overlap another
  /// @throws ValueError naming the tensor if one is empty, out of range or overlaps another.
  Mask(std::size_t n, std::vector<ParameterSpec> tensors)
      : n_(n), tensors_(std::move(tensors)), host_(n, 1), active_("kat::sparse::Mask::active", n) {
    const char *where = "kat::sparse::Mask";
    std::vector<std::pair<std::size_t, std::size_t>> ranges;
    for (const auto &t : tensors_) {
      if (t.size() == 0 || t.offset + t.size() > n_) {
        throw ValueError(kat::detail::concat(where, ": tensor '", t.name, "' covers [", t.offset,
                                             ", ", t.offset + t.size(),
                                             "), which must be a non-empty part of [0, ", n_, ")"));
      }
      ranges.emplace_back(t.offset, t.offset + t.size());
    }
    std::sort(ranges.begin(), ranges.end());
    for (std::size_t i = 1; i < ranges.size(); ++i) {
      if (ranges[i].first < ranges[i - 1].second) {
        throw ValueError(
            kat::detail::concat(where, ": tensors overlap at offset ", ranges[i].first));
      }
    }
    counts_.resize(tensors_.size());
    for (std::size_t t = 0; t < tensors_.size(); ++t) {
      counts_[t] = tensors_[t].size();
    }
    Kokkos::deep_copy(active_, std::uint8_t(1));
  }

  /// Draws each tensor's active entries uniformly at random: exactly
  /// kat::sparse::active_count(densities[t], size) of them, as a pure function of `seed`
  /// (the same on every process).
  /// @throws ShapeError if densities does not have one entry per tensor; ValueError if one is
  ///   outside (0, 1].
  void initialize(const std::vector<double> &densities, std::uint64_t seed) {
    kat::detail::require_extent("kat::sparse::Mask::initialize", "densities.size()",
                                tensors_.size(), densities.size());
    std::vector<std::uint8_t> host(n_, 1);
    for (std::size_t t = 0; t < tensors_.size(); ++t) {
      const double p = densities[t];
      if (!(p > 0.0 && p <= 1.0)) {
        throw ValueError(kat::detail::concat("kat::sparse::Mask::initialize: densities[", t, "] (",
                                             tensors_[t].name, ") must be in (0, 1], got ", p));
      }
      const std::size_t size = tensors_[t].size();
      const std::size_t k = kat::sparse::active_count(p, size);
      std::vector<std::size_t> order(size);
      std::iota(order.begin(), order.end(), std::size_t(0));
      // A partial Fisher-Yates shuffle: the first k of `order` are a uniform k-subset.
      kat::HostRng rng(kat::splitmix64(seed ^ kat::splitmix64(0x6d61736bULL + t)));
      for (std::size_t i = 0; i < k; ++i) {
        const std::size_t j = i + static_cast<std::size_t>(rng.uniform_index(size - i));
        std::swap(order[i], order[j]);
      }
      std::uint8_t *m = host.data() + tensors_[t].offset;
      std::fill(m, m + size, std::uint8_t(0));
      for (std::size_t i = 0; i < k; ++i) {
        m[order[i]] = 1;
      }
    }
    set(std::move(host));
  }

  /// Replaces the whole mask (length n, entries 0 or 1; entries outside the tensors must be 1).
  /// @throws ShapeError on another length; ValueError naming the first bad entry.
  void set(std::vector<std::uint8_t> host) {
    kat::detail::require_extent("kat::sparse::Mask::set", "mask length", n_, host.size());
    std::vector<std::uint8_t> inside(n_, 0);
    for (const auto &t : tensors_) {
      std::fill(inside.begin() + t.offset, inside.begin() + t.offset + t.size(), 1);
    }
    for (std::size_t i = 0; i < n_; ++i) {
      if (host[i] > 1 || (host[i] == 0 && inside[i] == 0)) {
        throw ValueError(kat::detail::concat(
            "kat::sparse::Mask::set: entry ", i, " must be ", inside[i] ? "0 or 1" : "1",
            " (it is ", inside[i] ? "inside" : "outside", " the masked tensors), got ",
            static_cast<int>(host[i])));
      }
    }
    host_ = std::move(host);
    for (std::size_t t = 0; t < tensors_.size(); ++t) {
      const auto *m = host_.data() + tensors_[t].offset;
      counts_[t] = static_cast<std::size_t>(std::count(m, m + tensors_[t].size(), 1));
    }
    const auto mirror = Kokkos::create_mirror_view(active_);
    std::copy(host_.begin(), host_.end(), mirror.data());
    Kokkos::deep_copy(active_, mirror);
  }

  /// Length n of the flat parameter vector.
  std::size_t size() const { return n_; }
  /// The masked tensors, as given.
  const std::vector<ParameterSpec> &tensors() const { return tensors_; }
  /// The flat mask on the device (length n; 1 = active).
  const mask_type &active() const { return active_; }
  /// Tensor t's part of active() (its size() entries, in the tensor's layout).
  mask_type active(std::size_t t) const {
    const auto &s = tensors_.at(t);
    return Kokkos::subview(active_, std::make_pair(s.offset, s.offset + s.size()));
  }
  /// The flat mask on the host, equal to active().
  const std::vector<std::uint8_t> &host() const { return host_; }
  /// Active entries of tensor t.
  std::size_t active_count(std::size_t t) const { return counts_.at(t); }
  /// Active entries over all masked tensors.
  std::size_t active_total() const {
    return std::accumulate(counts_.begin(), counts_.end(), std::size_t(0));
  }
  /// Entries of all masked tensors.
  std::size_t masked_total() const {
    std::size_t s = 0;
    for (const auto &t : tensors_) {
      s += t.size();
    }
    return s;
  }
  /// active_total() / masked_total() (1 with no masked tensor).
  double density() const {
    const std::size_t total = masked_total();
    return total == 0 ? 1.0 : static_cast<double>(active_total()) / static_cast<double>(total);
  }

  /// v(i) = 0 wherever the mask is 0; v has length n (parameters, gradients, a state buffer).
  /// @throws ShapeError on another length.
  void apply(const execution_space &space, const vector_type &v) const {
    kat::detail::require_extent("kat::sparse::Mask::apply", "vector length", n_,
                                static_cast<std::size_t>(v.extent(0)));
    detail::apply_mask(space, v, active_);
  }

  /// Masks the parameters and every state buffer of `optimizer` (momentum, Adam's moments).
  void apply(const execution_space &space, const vector_type &params,
             const optim::Optimizer<Scalar, MemorySpace> &optimizer) const {
    apply(space, params);
    for (const auto &b : optimizer.state_buffers()) {
      apply(space, b);
    }
  }

  /// "active" (uint8, [n]).
  StateDict state_dict() const {
    StateDict s;
    s.set("active", host_);
    return s;
  }

  /// Restores state_dict() after checking it; a refused state changes nothing.
  /// @throws StateError on missing, unexpected or misshapen entries; ValueError on entries
  ///   other than 0 or 1 or a 0 outside the masked tensors.
  void load_state_dict(const StateDict &state) {
    state.require_names("kat::sparse::Mask::load_state_dict", {"active"});
    state.checked<std::uint8_t>("active", {static_cast<std::uint64_t>(n_)});
    set(state.get_vector<std::uint8_t>("active", {static_cast<std::uint64_t>(n_)}));
  }

private:
  std::size_t n_;
  std::vector<ParameterSpec> tensors_;
  std::vector<std::uint8_t> host_;
  std::vector<std::size_t> counts_;
  mask_type active_;
};

} // namespace kat::sparse
