#pragma once
/// @file
/// @brief The processes that train one model together, as the training loop needs them.

#include <cstdint>
#include <vector>

namespace kat::train {

/// The group of processes that train one model together (PyTorch's ProcessGroup), reduced to
/// what a training loop needs besides the gradient synchronization itself: agreeing on
/// metrics, on the newest checkpoint every process holds, and on when an epoch starts. The
/// default is one process, where every operation is the identity; an MPI build provides
/// kat::distributed::MPIProcessGroup. Every member but rank() and size() is collective.
class ProcessGroup {
public:
  virtual ~ProcessGroup() = default;
  /// This process's index in [0, size()).
  virtual int rank() const { return 0; }
  /// The number of processes.
  virtual int size() const { return 1; }
  /// Replaces each of `values` by its sum over the processes (same length everywhere).
  virtual void sum(std::vector<double> &values) const { (void)values; }
  /// The minimum of `value` over the processes.
  virtual std::int64_t min(std::int64_t value) const { return value; }
  /// Every process's `values` (the same length everywhere): element r is process r's.
  virtual std::vector<std::vector<double>> gather(const std::vector<double> &values) const {
    return {values};
  }
  /// Returns once every process has called it.
  virtual void barrier() const {}
};

} // namespace kat::train
