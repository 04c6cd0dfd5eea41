#pragma once
/// @file
/// @brief The distributed K-FAC strategies by name, with their options, as a
/// kat::train::Registry. Needs KAT built with `-DKAT_ENABLE_MPI=ON`.

#ifndef KAT_ENABLE_MPI
// KAT::kat defines KAT_ENABLE_MPI and links MPI::MPI_CXX when configured with MPI.
#error "kat/distributed/kfac/kfac_strategies.hpp needs MPI: configure KAT with -DKAT_ENABLE_MPI=ON"
#else

#include "kat/distributed/comm/communicator.hpp"
#include "kat/distributed/kfac/dkfac.hpp"
#include "kat/distributed/kfac/dpkfac.hpp"
#include "kat/distributed/kfac/kaisa.hpp"
#include "kat/precond/kfac_strategy.hpp"
#include "kat/train/registry.hpp"

#include <functional>
#include <memory>

namespace kat::distributed {

/// Builds a strategy over `comm` for `kfac` (which it installs itself in) from the options.
template <class KFACType>
using KFACStrategyFactory = std::function<std::shared_ptr<precond::KFACStrategy<KFACType>>(
    Communicator &comm, KFACType &kfac, const train::Config &options)>;

/// The distributed K-FAC strategies (docs/distributed.md): "dkfac" (DKFAC), "dp-kfac"
/// (DPKFAC, option "dp-kfac-assignment": round-robin or balanced) and "kaisa" (KAISA, option
/// "grad-worker-fraction": k/P with k dividing P). A factory throws what the strategy's
/// constructor throws (ValueError for a fraction that does not fit the rank count, listing the
/// ones that do).
template <class KFACType> train::Registry<KFACStrategyFactory<KFACType>> kfac_strategies() {
  train::Registry<KFACStrategyFactory<KFACType>> r("K-FAC strategy");
  r.add("dkfac", "D-KFAC: batch factors averaged over the ranks, every rank decomposes all", {},
        [](Communicator &comm, KFACType &kfac, const train::Config &) {
          return std::make_shared<DKFAC<KFACType>>(comm, kfac);
        });
  r.add("dp-kfac", "DP-KFAC: each layer's factors on one rank, its P broadcast",
        {{"dp-kfac-assignment",
          "DP-KFAC: layers to ranks",
          "round-robin",
          {"round-robin", "balanced"}}},
        [](Communicator &comm, KFACType &kfac, const train::Config &c) {
          DPKFACOptions o;
          o.assignment = c.text("dp-kfac-assignment") == "balanced" ? LayerAssignment::balanced
                                                                    : LayerAssignment::round_robin;
          return std::make_shared<DPKFAC<KFACType>>(comm, kfac, o);
        });
  r.add("kaisa", "KAISA: factors averaged, each decomposition on one rank",
        {{"grad-worker-fraction",
          "KAISA: k/P with k dividing P: 1 COMM-OPT, 1/P MEM-OPT, between HYBRID-OPT", "1"}},
        [](Communicator &comm, KFACType &kfac, const train::Config &c) {
          KAISAOptions o;
          o.grad_worker_fraction = c.number("grad-worker-fraction");
          return std::make_shared<KAISA<KFACType>>(comm, kfac, o);
        });
  return r;
}

} // namespace kat::distributed

namespace kat {
/// The short name of kat::distributed.
namespace dist = distributed;
} // namespace kat

#endif // KAT_ENABLE_MPI
