#pragma once
/// @file
/// @brief The training-step role that changes the gradient between backward and the optimizer.

#include "kat/core/state.hpp"
#include "kat/core/views.hpp"

#include <cstddef>
#include <cstdint>
#include <string>

namespace kat::train {

/// What a GradientTransform has communicated and holds, for logs and profiles.
struct TransformStats {
  /// Payload bytes it has handed to the network since it was made (0 on one process).
  std::uint64_t bytes = 0;
  /// Bytes of memory its state holds on this process now.
  std::size_t state_bytes = 0;
  /// Whether its next transform() also updates its curvature (for K-FAC: the Kronecker factors),
  /// so a profile can report bytes per second-order update.
  bool next_updates_curvature = false;
};

/// Role of a training step: rewrites the (already synchronized) gradient before the
/// optimizer uses it. Preconditioners (K-FAC with any distributed strategy, see
/// kat::train::KFACTransform) and gradient corrections act here. A transform may communicate
/// (then every process calls transform() in the same order) and may keep state.
template <class Scalar, class MemorySpace> class GradientTransform {
public:
  /// Where the transform's kernels run.
  using execution_space = typename MemorySpace::execution_space;
  using vector_type = Vector<Scalar, MemorySpace>; ///< the flat gradient vector

  virtual ~GradientTransform() = default;
  /// A short name for logs, and the prefix of its checkpoint entries ("kfac").
  virtual std::string name() const = 0;
  /// Rewrites `grads`, the model's flat gradient vector (length: the model's parameter count),
  /// in place, with the work enqueued on `space`. `params` is the flat parameter vector.
  virtual void transform(const execution_space &space, const vector_type &params,
                         const vector_type &grads) = 0;
  /// What it does and how it is configured, for logs (one or more lines).
  virtual std::string summary() const { return name(); }
  /// See TransformStats.
  virtual TransformStats stats() const { return {}; }
  /// State a checkpoint must hold to continue bit-identically (kat/core/state.hpp).
  virtual StateDict state_dict() const { return {}; }
  /// Restores state_dict(). @throws StateError on entries this object does not expect.
  virtual void load_state_dict(const StateDict &state) {
    state.require_names("kat::train::GradientTransform(" + name() + ")::load_state_dict", {});
  }
};

} // namespace kat::train
