#pragma once
// Shared by the distributed K-FAC tests (test_dkfac.cpp, test_dpkfac.cpp): a small MLP, the
// K-FAC schedules they sweep, and the global batches every rank generates alike.
#include "test_helpers.hpp"

#include <kat/nn/activation.hpp>
#include <kat/nn/dense.hpp>
#include <kat/nn/flatten.hpp>
#include <kat/nn/sequential.hpp>
#include <kat/precond/kfac.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace kat::test::dist_kfac {

using Model = nn::Sequential<double, Mem>;
using KFACd = KFAC<double, Mem>;

constexpr std::size_t kBatch = 8;
constexpr int kSteps = 4;

// Flatten, Dense(6, 12), Tanh, Dense(12, 8), ReLU, Dense(8, 4): the Dense layers are model
// layers 1, 3, 5 with out 12, 8, 4 and in+1 7, 13, 9 (factors A of 7, 13, 9, G of 12, 8, 4).
inline void build_mlp(Model &model, std::uint64_t seed) {
  model.add<nn::Flatten>();
  model.add<nn::Dense>(6, 12);
  model.add<nn::Tanh>();
  model.add<nn::Dense>(12, 8);
  model.add<nn::ReLU>();
  model.add<nn::Dense>(8, 4);
  model.compile(Space(), seed);
}

struct Config {
  std::int64_t factor_every, inv_every;
  ComputeMethod method;
};

inline std::string describe(const Config &c) {
  return std::string(c.method == ComputeMethod::eigen ? "eigen" : "inverse") +
         " factor_update_steps " + std::to_string(c.factor_every) + " inv_update_steps " +
         std::to_string(c.inv_every);
}

inline const std::vector<Config> kConfigs{{1, 1, ComputeMethod::eigen},
                                          {2, 2, ComputeMethod::eigen},
                                          {1, 2, ComputeMethod::inverse},
                                          {2, 4, ComputeMethod::inverse}};

inline KFACd::Options kfac_options(const Config &c) {
  KFACd::Options o;
  o.factor_update_steps = c.factor_every;
  o.inv_update_steps = c.inv_every;
  o.compute_method = c.method;
  o.damping = 0.01;
  o.factor_decay = 0.8;
  o.kl_clip = 0.01;
  o.lr = 0.1;
  return o;
}

// Rows [first, first + count) of step s's global batch, which every rank generates alike.
struct Batch {
  Matrix<double, Mem> x;
  Vector<std::int32_t, Mem> y;
};
inline Batch batch_rows(int step, std::size_t first, std::size_t count) {
  const auto x = to_host(random_matrix<double>(kBatch, 6, 300 + std::uint64_t(step)));
  std::vector<std::int32_t> y(kBatch);
  HostRng rng(400 + std::uint64_t(step));
  for (auto &label : y)
    label = static_cast<std::int32_t>(rng.uniform_index(4));
  Batch b;
  b.x = Matrix<double, Mem>("x", count, 6);
  auto hx = Kokkos::create_mirror_view(b.x);
  for (std::size_t j = 0; j < 6; ++j)
    for (std::size_t i = 0; i < count; ++i)
      hx(i, j) = x(first + i, j);
  Kokkos::deep_copy(b.x, hx);
  b.y = labels_of(std::vector<std::int32_t>(y.begin() + std::ptrdiff_t(first),
                                            y.begin() + std::ptrdiff_t(first + count)));
  return b;
}

} // namespace kat::test::dist_kfac
