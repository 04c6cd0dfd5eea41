#pragma once
/// @file
/// @brief The distributed K-FAC strategies refuse KFACOptions::factored_preconditioning.

#include "kat/core/error.hpp"

namespace kat::distributed::detail {

/// The strategies precondition gradients averaged over the ranks, which are not the local
/// batch's gᵀa that KFACOptions::factored_preconditioning needs (its check would throw on the
/// first factored step), so they refuse it when they are built.
/// @throws ValueError naming `strategy` if kfac.options().factored_preconditioning is set.
template <class KFACType> void reject_factored(const KFACType &kfac, const char *strategy) {
  if (kfac.options().factored_preconditioning) {
    throw ValueError(kat::detail::concat(
        "kat::distributed::", strategy,
        ": KFACOptions::factored_preconditioning must be false, got true: the gradients are "
        "averaged over the ranks, so they are not the local batch's gᵀa it needs"));
  }
}

} // namespace kat::distributed::detail
