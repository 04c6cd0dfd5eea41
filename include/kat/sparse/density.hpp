#pragma once
/// @file
/// @brief Initial per-layer densities of a sparse network: uniform or Erdős–Rényi-Kernel.

#include "kat/core/error.hpp"

#include <cmath>
#include <cstddef>
#include <string>
#include <vector>

namespace kat::sparse {

/// How the global density is spread over the masked tensors.
enum class SparseInit {
  /// Every masked tensor gets the global density.
  uniform,
  /// Erdős–Rényi-Kernel (Evci et al. 2020, "Rigging the Lottery", sec. 3; Mocanu et al. 2018
  /// for the Erdős–Rényi case of matrices): a tensor of shape (d_1, ..., d_k) gets a density
  /// proportional to (d_1 + ... + d_k) / (d_1 · ... · d_k), so small layers stay denser.
  erk
};

/// "uniform" or "erk".
inline std::string to_string(SparseInit init) {
  return init == SparseInit::uniform ? "uniform" : "erk";
}

/// Parses "uniform" or "erk".
/// @throws ValueError naming `what` and the accepted values otherwise.
inline SparseInit parse_sparse_init(const std::string &text, const char *what = "sparse_init") {
  if (text == "uniform") {
    return SparseInit::uniform;
  }
  if (text == "erk") {
    return SparseInit::erk;
  }
  throw ValueError(kat::detail::concat(what, " must be 'uniform' or 'erk', got '", text, "'"));
}

/// The densities of tensors with the given shapes (each in (0, 1]) such that the active
/// entries, Σ_l round(p_l · n_l), come as close as rounding allows to `density` · Σ_l n_l.
///
/// ERK: p_l = ε · Σdims_l / Πdims_l, with ε chosen so the total is density · Σ n_l. A tensor
/// whose p_l would exceed 1 is made dense and ε is solved again over the others (the dense
/// layers' redistribution of the RigL reference), until every p_l <= 1.
///
/// @param shapes  the masked tensors' shapes (each non-empty, every extent > 0)
/// @param density the global target fraction of active entries, in (0, 1]
/// @param init    how the density is spread: uniform, or ERK as above
/// @throws ValueError if density is outside (0, 1] or not finite, or a shape is empty or has a
///   zero extent (the message names the tensor's index).
inline std::vector<double> layer_densities(const std::vector<std::vector<std::size_t>> &shapes,
                                           double density, SparseInit init) {
  const char *where = "kat::sparse::layer_densities";
  if (!(std::isfinite(density) && density > 0.0 && density <= 1.0)) {
    throw ValueError(kat::detail::concat(where, ": density must be in (0, 1], got ", density));
  }
  std::vector<double> sizes(shapes.size()), raw(shapes.size());
  for (std::size_t l = 0; l < shapes.size(); ++l) {
    if (shapes[l].empty()) {
      throw ValueError(kat::detail::concat(where, ": shape of tensor ", l, " must not be empty"));
    }
    double size = 1, sum = 0;
    for (const std::size_t e : shapes[l]) {
      if (e == 0) {
        throw ValueError(
            kat::detail::concat(where, ": tensor ", l, " has a zero extent; extents must be > 0"));
      }
      size *= static_cast<double>(e);
      sum += static_cast<double>(e);
    }
    sizes[l] = size;
    raw[l] = sum / size;
  }
  std::vector<double> p(shapes.size(), density);
  if (init == SparseInit::uniform || density == 1.0) {
    return p;
  }
  std::vector<bool> dense(shapes.size(), false);
  double total = 0;
  for (const double s : sizes) {
    total += s;
  }
  for (;;) {
    // Σ_dense n_l + ε Σ_sparse raw_l n_l = density Σ n_l
    double dense_size = 0, weighted = 0;
    for (std::size_t l = 0; l < shapes.size(); ++l) {
      if (dense[l]) {
        dense_size += sizes[l];
      } else {
        weighted += raw[l] * sizes[l];
      }
    }
    if (weighted == 0) {
      break; // every tensor dense
    }
    const double epsilon = (density * total - dense_size) / weighted;
    // The tensor that overflows most becomes dense first, as in the RigL reference.
    std::size_t worst = shapes.size();
    double worst_p = 1.0;
    for (std::size_t l = 0; l < shapes.size(); ++l) {
      if (!dense[l] && epsilon * raw[l] > worst_p) {
        worst = l;
        worst_p = epsilon * raw[l];
      }
    }
    if (worst == shapes.size()) {
      for (std::size_t l = 0; l < shapes.size(); ++l) {
        p[l] = dense[l] ? 1.0 : epsilon * raw[l];
      }
      break;
    }
    dense[worst] = true;
  }
  return p;
}

/// The number of active entries of a tensor of `size` entries at density `p`:
/// round(p · size), at least 1 (a masked tensor never loses all of its connections).
inline std::size_t active_count(double p, std::size_t size) {
  const auto k = static_cast<std::size_t>(std::floor(p * static_cast<double>(size) + 0.5));
  return k < 1 ? 1 : (k > size ? size : k);
}

} // namespace kat::sparse
