#pragma once
/// @file
/// @brief DHO2's overlapped curvature estimation: the split of the ranks into training and
/// curvature ranks (dho2_roles), the options that bound the staleness (DHO2Overlap), and the
/// curvature ranks' side (DHO2Estimator). The training ranks' side is
/// kat::distributed::DHO2's overlapped constructor (kat/distributed/fosi/dho2.hpp). Gu et al.,
/// "DHO2", arXiv 2505.00982. Needs KAT built with `-DKAT_ENABLE_MPI=ON`.

#ifndef KAT_ENABLE_MPI
#error "kat/distributed/fosi/dho2_overlap.hpp needs MPI: configure KAT with -DKAT_ENABLE_MPI=ON"
#else

#include "kat/core/error.hpp"
#include "kat/core/lanczos.hpp"
#include "kat/core/views.hpp"
#include "kat/distributed/comm/communicator.hpp"
#include "kat/distributed/fosi/parameter_shard.hpp"
#include "kat/distributed/fosi/sharded_lanczos.hpp"

#include <Kokkos_Core.hpp>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace kat::distributed {

/// The ranks of a communicator split for overlapped DHO2: the first `training_ranks` train
/// (their rank 0 is the parent's rank 0), the last `curvature_ranks` estimate the curvature on
/// parameter snapshots the training ranks send them.
struct DHO2Roles {
  int training_ranks = 0;  ///< ranks that train
  int curvature_ranks = 0; ///< ranks that estimate the curvature
  /// Whether this rank is a curvature rank.
  bool curvature = false;
  /// A duplicate of the parent communicator, on which the two groups exchange snapshots and
  /// estimates: training rank t is its rank t, curvature rank c its rank training_ranks + c.
  std::shared_ptr<Communicator> bridge;
  /// This rank's group: the training ranks' communicator, or the curvature ranks'.
  std::shared_ptr<Communicator> group;
};

/// Splits `comm` (P ranks) into P - curvature_ranks training ranks and curvature_ranks
/// curvature ranks (the last ones). Collective on `comm`.
/// @throws ValueError unless 1 <= curvature_ranks <= P - 1.
inline DHO2Roles dho2_roles(const Communicator &comm, int curvature_ranks) {
  if (curvature_ranks < 1 || curvature_ranks > comm.size() - 1) {
    throw ValueError(kat::detail::concat(
        "kat::distributed::dho2_roles: curvature_ranks must be in [1, P - 1] = [1, ",
        comm.size() - 1, "] (at least one rank must train), got ", curvature_ranks));
  }
  DHO2Roles roles;
  roles.curvature_ranks = curvature_ranks;
  roles.training_ranks = comm.size() - curvature_ranks;
  roles.curvature = comm.rank() >= roles.training_ranks;
  roles.bridge = std::make_shared<Communicator>(comm.dup());
  roles.group = std::make_shared<Communicator>(comm.split(roles.curvature ? 1 : 0, comm.rank()));
  return roles;
}

/// When the training ranks swap in an estimate of the curvature ranks.
enum class DHO2Swap {
  /// At the first step at which every training rank has it (one 4-byte all-reduce per step
  /// while an estimate is in flight), and at the latest at the staleness bound.
  eager,
  /// Exactly at the staleness bound (waiting for it if need be): the run does not depend on
  /// timing, so it is reproducible; no per-step all-reduce.
  fixed,
};

/// How overlapped DHO2 bounds the staleness of its curvature.
struct DHO2Overlap {
  /// S: an estimate started at step s (from the parameters before update s) is used from
  /// update s + d on, 0 <= d <= S; the training ranks wait for it at s + S. Independently, an
  /// estimate is always finished before the next is started, so d <= T (FOSI's
  /// num_iters_to_approx_eigs) too. 0: synchronous, computed on the curvature ranks. Empty
  /// (the default): T, so an estimate may take until the next one is due.
  std::optional<std::int64_t> staleness_bound;
  /// When a finished estimate replaces the previous one (DHO2Swap).
  DHO2Swap swap = DHO2Swap::eager;
};

namespace detail {

// The messages on DHO2Roles::bridge. Training rank 0 sends each curvature rank a command
// (int64: what, Lanczos seed, m, k, l); each training rank sends each curvature rank its slice
// of the parameters; each curvature rank sends each training rank whose slice overlaps its own
// a result: doubles [status (0 ok, 1 failed), Lanczos seconds, iterations, the k + l
// eigenvalues, the shared rows of the Ritz vectors (rows x (k + l), column-major)].
inline constexpr int dho2_command_tag = 0x4432;
inline constexpr int dho2_params_tag = dho2_command_tag + 1;
inline constexpr int dho2_result_tag = dho2_command_tag + 2;
inline constexpr std::int64_t dho2_stop = 0;
inline constexpr std::int64_t dho2_estimate = 1;
inline constexpr std::size_t dho2_command_length = 5;
inline constexpr std::size_t dho2_header_length = 3;

/// The rows [first, second) of the flat vector that two shards share (first == second: none).
inline std::pair<std::size_t, std::size_t> shared_rows(const ParameterShard &a,
                                                       const ParameterShard &b) {
  const std::size_t first = std::max(a.offset, b.offset);
  const std::size_t second = std::min(a.offset + a.size, b.offset + b.size);
  return {first, std::max(first, second)};
}

inline std::size_t dho2_result_length(std::size_t kl, std::pair<std::size_t, std::size_t> rows) {
  return dho2_header_length + kl + (rows.second - rows.first) * kl;
}

} // namespace detail

/// The curvature ranks' side of overlapped DHO2 (kat::distributed::DHO2, Gu et al., arXiv
/// 2505.00982): serve() waits for the training ranks' requests; for each it receives the
/// parameter snapshot into `params`, runs sharded_lanczos over the curvature ranks (each keeps
/// its shard() of the basis and Ritz vectors, and the operator differentiates this rank's
/// share of the curvature batch), and sends every training rank the rows of the Ritz vectors
/// that fall in its slice, with the eigenvalues. The curvature ranks never hold the whole
/// k x n eigenvectors, and the training ranks never run Lanczos.
///
/// A failing estimate (the operator throws or returns non-finite values on any curvature
/// rank: sharded_operator turns that into an error on all of them) is reported to the training
/// ranks, whose DHO2::step() throws; serve() goes on until they stop it, then throws the
/// error too, so every rank ends with one.
template <class Scalar = float, class MemorySpace = kat::DefaultMemorySpace> class DHO2Estimator {
public:
  /// Where the curvature operator runs.
  using execution_space = typename MemorySpace::execution_space;
  using vector_type = Vector<Scalar, MemorySpace>; ///< a slice of a parameter-length vector

  /// @param roles  from dho2_roles, on a curvature rank.
  /// @param n  the length of the flat parameter vector (as on the training ranks).
  /// @param params  the length-n vector the curvature operator reads (e.g. the model's
  ///   parameters()); every request overwrites it with the training ranks' snapshot.
  /// @param curvature  maps this rank's padded slice (shard()) to its slice of the product,
  ///   collectively over the curvature ranks (sharded_operator on roles.group, e.g.
  ///   sharded_curvature_operator).
  /// @throws ValueError if this is not a curvature rank, `params` is not of length n, or
  ///   curvature is empty; as parameter_shard for n too small.
  DHO2Estimator(const DHO2Roles &roles, std::size_t n, vector_type params,
                LinearOperator<MemorySpace> curvature)
      : roles_(checked(roles)),
        shard_(parameter_shard(n, roles.group->rank(), roles.curvature_ranks)),
        params_(std::move(params)), curvature_(std::move(curvature)),
        comm_(std::make_shared<Communicator>(roles.group->dup())) {
    const char *who = "kat::distributed::DHO2Estimator";
    if (static_cast<std::size_t>(params_.extent(0)) != n) {
      throw ValueError(kat::detail::concat(who, ": params must have n = ", n, " entries, got ",
                                           params_.extent(0)));
    }
    if (!curvature_) {
      throw ValueError(kat::detail::concat(who, ": curvature must be callable, got an empty "
                                                "operator"));
    }
  }

  /// This rank's slice among the curvature ranks (parameter_shard(n, c, C)).
  const ParameterShard &shard() const { return shard_; }

  /// Serves estimates until training rank 0 sends stop (when its DHO2 is destroyed, or
  /// DHO2::stop_estimators()). Returns the number of estimates served. Collective over the
  /// curvature ranks, and the counterpart of the training ranks' DHO2.
  /// @throws Error after the stop if an estimate failed (the first failure's message); MPIError.
  std::int64_t serve(const execution_space &space) {
    const Kokkos::DefaultHostExecutionSpace host;
    Communicator &bridge = *roles_.bridge;
    const int T = roles_.training_ranks;
    Kokkos::View<std::int64_t *, Kokkos::HostSpace> command("kat::DHO2Estimator::command",
                                                            detail::dho2_command_length);
    std::string failure;
    std::int64_t served = 0;
    for (;;) {
      bridge.irecv(host, command, 0, detail::dho2_command_tag).wait();
      if (command(0) == detail::dho2_stop) {
        break;
      }
      {
        std::vector<Request> snapshot;
        for (int t = 0; t < T; ++t) {
          const ParameterShard s = parameter_shard(shard_.n, t, T);
          snapshot.push_back(bridge.irecv(
              space, Kokkos::subview(params_, std::make_pair(s.offset, s.offset + s.size)), t,
              detail::dho2_params_tag));
        }
        for (auto &r : snapshot) {
          r.wait();
        }
      }
      LanczosOptions lo;
      std::uint64_t seed = 0;
      std::memcpy(&seed, &command(1), sizeof seed);
      lo.seed = seed;
      lo.m = static_cast<std::size_t>(command(2));
      lo.k = static_cast<std::size_t>(command(3));
      lo.l = static_cast<std::size_t>(command(4));
      LanczosResult<MemorySpace> result;
      double status = 0.0;
      const auto start = std::chrono::steady_clock::now();
      try {
        result = sharded_lanczos<MemorySpace>(space, *comm_, curvature_, shard_, lo);
      } catch (const std::exception &e) {
        status = 1.0;
        const std::string message = kat::detail::concat(
            "kat::distributed::DHO2Estimator: estimate ", served, " failed on curvature rank ",
            shard_.rank, " of ", shard_.ranks, ": ", e.what());
        std::fprintf(stderr, "%s\n", message.c_str());
        if (failure.empty()) {
          failure = message;
        }
      }
      last_seconds_ =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      seconds_ += last_seconds_;
      send_result(space, status, lo.k + lo.l, result);
      ++served;
    }
    if (!failure.empty()) {
      throw Error(failure);
    }
    return served;
  }

  /// What this rank passed to MPI for DHO2 (the bridge and its Lanczos reductions; not what
  /// the curvature operator sends on its own communicator).
  CommunicatorStats stats() const {
    CommunicatorStats s = comm_->stats();
    s += roles_.bridge->stats();
    return s;
  }

  /// Wall seconds of the last Lanczos run and of all of them.
  double last_lanczos_seconds() const { return last_seconds_; }
  /// Wall seconds of all Lanczos runs so far.
  double lanczos_seconds() const { return seconds_; }

private:
  static const DHO2Roles &checked(const DHO2Roles &roles) {
    if (!roles.curvature || !roles.bridge || !roles.group) {
      throw ValueError("kat::distributed::DHO2Estimator: roles must be a curvature rank's "
                       "(dho2_roles(...).curvature true), got a training rank's or empty roles");
    }
    return roles;
  }

  void send_result(const execution_space &space, double status, std::size_t kl,
                   const LanczosResult<MemorySpace> &result) {
    using Matrix =
        Kokkos::View<double **, Kokkos::LayoutLeft, MemorySpace, Kokkos::MemoryUnmanaged>;
    const int T = roles_.training_ranks;
    std::vector<double> header(detail::dho2_header_length + kl, 0.0);
    header[0] = status;
    header[1] = last_seconds_;
    if (status == 0.0) {
      header[2] = static_cast<double>(result.iterations);
      std::copy(result.eigenvalues.begin(), result.eigenvalues.end(),
                header.begin() + detail::dho2_header_length);
    }
    const Kokkos::View<const double *, Kokkos::HostSpace, Kokkos::MemoryUnmanaged> head(
        header.data(), header.size());
    std::vector<Request> sends;
    for (int t = 0; t < T; ++t) {
      const auto rows = detail::shared_rows(shard_, parameter_shard(shard_.n, t, T));
      if (rows.first == rows.second) {
        continue;
      }
      Vector<double, MemorySpace> buffer("kat::DHO2Estimator::result",
                                         detail::dho2_result_length(kl, rows));
      Kokkos::deep_copy(
          space, Kokkos::subview(buffer, std::make_pair(std::size_t(0), header.size())), head);
      if (status == 0.0) {
        const Matrix block(buffer.data() + header.size(), rows.second - rows.first, kl);
        Kokkos::deep_copy(
            space, block,
            Kokkos::subview(result.eigenvectors,
                            std::make_pair(rows.first - shard_.offset, rows.second - shard_.offset),
                            Kokkos::ALL));
      }
      sends.push_back(roles_.bridge->isend(space, buffer, t, detail::dho2_result_tag));
    }
    for (auto &s : sends) {
      s.wait();
    }
  }

  DHO2Roles roles_;
  ParameterShard shard_;
  vector_type params_;
  LinearOperator<MemorySpace> curvature_;
  std::shared_ptr<Communicator> comm_; // the curvature ranks' Lanczos reductions
  double last_seconds_ = 0.0;
  double seconds_ = 0.0;
};

} // namespace kat::distributed

#endif
