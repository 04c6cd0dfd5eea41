#pragma once
// Shared by the distributed K-FAC tests (test_dkfac.cpp, test_dpkfac.cpp, test_kaisa.cpp;
// MPI builds only): a small MLP, the K-FAC schedules they sweep, the global batches every rank
// generates alike, and one data-parallel K-FAC + SGD replica to train with.
#include "mpi_test_helpers.hpp"

#include <kat/distributed/comm/communicator.hpp>
#include <kat/distributed/data_parallel/data_parallel.hpp>
#include <kat/nn/activation.hpp>
#include <kat/nn/dense.hpp>
#include <kat/nn/flatten.hpp>
#include <kat/nn/sequential.hpp>
#include <kat/nn/softmax_cross_entropy.hpp>
#include <kat/optim/sgd.hpp>
#include <kat/precond/kfac.hpp>
#include <kat/precond/kfac_strategy.hpp>

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

namespace kat::test::dist_kfac {

using namespace kat::precond;

using Model = nn::Sequential<double, Mem>;
using KFACd = KFAC<double, Mem>;

// Divisible by 1, 2, 3, 4, 6 and 8: the batch splits evenly over the ranks the tests run at.
constexpr std::size_t kBatch = 24;
constexpr int kSteps = 4;

struct Config {
  std::int64_t factor_every, inv_every;
  ComputeMethod method;
};

// The steps among the kSteps steps 0, 1, ... that are multiples of `period`.
inline std::uint64_t every(std::int64_t period) {
  return std::uint64_t((kSteps + period - 1) / period);
}

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

inline optim::SGD<double, Mem>::Options sgd_options() {
  optim::SGD<double, Mem>::Options sgd;
  sgd.lr = 0.1;
  sgd.momentum = 0.9;
  return sgd;
}

// One rank's model (or, without a communicator, the single-process reference) with K-FAC on
// `c`'s schedule and SGD; with a communicator the gradients are averaged by DataParallel and
// every rank starts from rank 0's initialization (seed 11, the reference's). A strategy is
// installed on `kfac` by the caller between construction and the first step.
struct Replica {
  Space space;
  Model model{FeatureShape{1, 2, 3}};
  std::unique_ptr<dist::DataParallel<double, Mem>> dp;
  KFACd kfac;
  std::unique_ptr<optim::SGD<double, Mem>> opt;
  nn::SoftmaxCrossEntropy<double, Mem> loss;
  Matrix<double, Mem> dlogits;
  std::size_t first, count;

  // Trains on rows [first, first + count) of each global batch.
  Replica(dist::Communicator *comm, const Config &c, std::size_t first_row, std::size_t rows)
      : kfac(kfac_options(c)), dlogits("dlogits", rows, 4), first(first_row), count(rows) {
    build_mlp(model, comm != nullptr ? 11 + std::uint64_t(comm->rank()) : 11);
    if (comm != nullptr) {
      dp = std::make_unique<dist::DataParallel<double, Mem>>(*comm, model);
      dp->broadcast_parameters(space);
      model.set_backward_hook(dp->backward_hook(space));
    }
    REQUIRE(kfac.register_model(model) == 3);
    opt = std::make_unique<optim::SGD<double, Mem>>(model.parameter_count(), sgd_options());
  }
  Replica(const Replica &) = delete;
  Replica &operator=(const Replica &) = delete;
  ~Replica() { model.clear_backward_hook(); }

  // Forward, backward, gradient averaging and kfac.step() on step `s`'s rows.
  void precondition(int s) {
    const Batch b = batch_rows(s, first, count);
    loss.forward_backward(space, model.forward(space, b.x), b.y, dlogits);
    model.backward(space, dlogits, Model::Gradients::overwrite);
    if (dp) {
      dp->finish(space);
    }
    kfac.step(space);
  }
  // The SGD step on the preconditioned gradients.
  void update() { opt->step(space, model.parameters(), model.gradients()); }

  std::vector<double> parameters() const {
    const auto p = to_host(model.parameters());
    return std::vector<double>(p.data(), p.data() + p.size());
  }
};

inline double max_abs_diff(const std::vector<double> &a, const std::vector<double> &b) {
  REQUIRE(a.size() == b.size());
  double worst = 0;
  for (std::size_t k = 0; k < a.size(); ++k)
    worst = std::max(worst, std::abs(a[k] - b[k]));
  return worst;
}

// A view's entries in memory order (contiguous views).
template <class View> std::vector<double> values_of(const View &v) {
  const auto h = to_host(v);
  return std::vector<double>(h.data(), h.data() + h.span());
}

// The injected-failure tests (test_kaisa.cpp, test_dpkfac.cpp): the MLP with a distributed
// K-FAC strategy on its rank's rows, factors built at step 0 only (a factor corrupted
// afterwards reaches the next decomposition unchanged) and decompositions every step.
// `make(kfac)` installs the strategy.
template <class Strategy> struct FaultyRun {
  Space space;
  std::ostringstream log; // the schedule warning and the keep_previous_on_failure warnings
  Model model{FeatureShape{1, 2, 3}};
  std::unique_ptr<KFACd> kfac;
  std::unique_ptr<Strategy> strategy;
  Matrix<double, Mem> dlogits{"dlogits", 2, 4};
  nn::SoftmaxCrossEntropy<double, Mem> loss;
  std::vector<double> backward_gradients; // see failing_step()

  template <class Make> FaultyRun(ComputeMethod method, bool keep_previous, const Make &make) {
    build_mlp(model, 11);
    KFACd::Options o = kfac_options({1, 1, method});
    o.factor_update_steps = Hyperparameter<std::int64_t>(
        [](std::int64_t step) { return std::int64_t(step == 0 ? 1 : 1000); });
    o.keep_previous_on_failure = keep_previous;
    o.log = &log;
    kfac = std::make_unique<KFACd>(o);
    REQUIRE(kfac->register_model(model) == 3);
    strategy = make(*kfac);
  }
  // Forward and backward on two rows of step s's batch that depend on the rank.
  void forward_backward(int s, int rank) {
    const Batch b = batch_rows(s, 2 * std::size_t(rank) % kBatch, 2);
    loss.forward_backward(space, model.forward(space, b.x), b.y, dlogits);
    model.backward(space, dlogits, Model::Gradients::overwrite);
  }
  // Step 0 on this rank's rows: factors and the first decompositions.
  void first_step(int rank) {
    forward_backward(0, rank);
    kfac->step(space);
  }
  // On rank `owner` only (this is rank `rank`), overwrites factor `which` of registered layer
  // 1 with NaN, so that its next decomposition fails there.
  void poison(int owner, int rank, char which) const {
    if (rank == owner) {
      const auto &f = which == 'A' ? kfac->factor_a(1) : kfac->factor_g(1);
      Kokkos::deep_copy(f.factor(), std::numeric_limits<double>::quiet_NaN());
    }
  }
  // Step 1's kfac.step() (after its forward and backward, whose gradients it keeps in
  // `backward_gradients`): the NumericalError's message, or empty if it did not throw.
  std::string failing_step(int rank) {
    forward_backward(1, rank);
    backward_gradients = values_of(model.gradients());
    try {
      kfac->step(space);
    } catch (const NumericalError &e) {
      return e.what();
    }
    return {};
  }
  // The decomposition of factor `which` of registered layer `layer` (eigenvalues or inverse;
  // empty without one).
  std::vector<double> decomposition(std::size_t layer, char which) const {
    const auto &f = which == 'A' ? kfac->factor_a(layer) : kfac->factor_g(layer);
    if (kfac->options().compute_method == ComputeMethod::eigen) {
      return f.has_eigen() ? values_of(f.eigenvalues()) : std::vector<double>();
    }
    return f.has_inverse() ? values_of(f.inverse()) : std::vector<double>();
  }
};

// A run continued from KFAC::state_dict() on every rank (as kat_train resumes) steps as the run
// it was taken from, bit for bit: through the steps between decomposition steps, where the
// restored decompositions must be used on every rank at once, and the next decomposition step.
// `make(comm, kfac)` installs the strategy on `comm` (a duplicate of the communicator's, as
// kat_train's) and returns it, to be kept alive.
template <class Make> void check_state_dict_continues(dist::Communicator &world, const Make &make) {
  const Config c{1, 3, ComputeMethod::eigen}; // decompositions at steps 0, 3, 6
  const std::size_t rows = kBatch / std::size_t(world.size());
  const std::size_t first = rows * std::size_t(world.rank());
  dist::Communicator comm_a = world.dup(), comm_b = world.dup();
  Replica a(&world, c, first, rows), b(&world, c, first, rows);
  const auto strategy_a = make(comm_a, a.kfac);
  const auto strategy_b = make(comm_b, b.kfac);
  for (int s = 0; s < 4; ++s) {
    a.precondition(s);
    a.update();
  }
  b.kfac.load_state_dict(a.kfac.state_dict());
  for (int s = 4; s < 7; ++s) {
    INFO("step " << s);
    Kokkos::deep_copy(b.model.parameters(), a.model.parameters());
    a.precondition(s);
    b.precondition(s);
    CHECK(values_of(b.model.gradients()) == values_of(a.model.gradients()));
    a.update();
  }
}

// One layer given by views, a float model with double inverses, a factor and a decomposition
// on every step, and the same (already averaged) gradient on every rank: the precision test of
// the strategies that broadcast P. a and g are shifted by `shift` (DP-KFAC: only the owner's
// must matter); `install(kfac)` may install a strategy, returned to be kept alive. Returns
// each step's preconditioned gradient (host, column-major) and the strategy's report.
// a and g are multiples of 1/8 and 1/32 over 4 rows, so each batch factor (aᵀa/4, the same
// for g) has a few significant bits: a strategy's average of equal factors over any number of
// ranks, (x + ... + x) · fl(1/P), is then x exactly (at P = 3 as at 2 and 4), and the factors
// are those of one process.
struct FloatRun {
  std::vector<std::vector<float>> gradients;
  precond::KFACStrategyReport report;
};
using KFACf = KFAC<float, Mem, double>;
template <class Install>
FloatRun float_layer(std::size_t shift, ComputeMethod method, const Install &install) {
  constexpr std::size_t out = 3, cols = 4, rows = 4;
  KFACOptions o;
  o.factor_update_steps = 1;
  o.inv_update_steps = 1;
  o.damping = 0.1;
  o.lr = 0.1;
  o.compute_method = method;
  KFACf kfac(o);
  const auto a = matrix_of<float>(rows, cols, [&](std::size_t i, std::size_t j) {
    return j + 1 == cols ? 1.0 : (double((3 * i + 5 * j + 7 * shift) % 11) - 5.0) / 8.0;
  });
  const auto g = matrix_of<float>(rows, out, [&](std::size_t i, std::size_t j) {
    return (double((2 * i + 3 * j + 5 * shift) % 7) - 3.0) / 32.0;
  });
  Matrix<float, Mem> grad("grad", out, cols);
  kfac.register_layer("dense", [&] {
    KFACf::record_type rec;
    rec.a = a;
    rec.g = g;
    rec.weight_gradient = grad;
    rec.samples = rows;
    return rec;
  });
  const auto strategy = install(kfac); // kept alive until the end of the run
  (void)strategy;
  FloatRun run;
  for (int s = 0; s < 3; ++s) {
    Kokkos::deep_copy(grad, matrix_of<float>(out, cols, [&](std::size_t i, std::size_t j) {
                        return 0.1 * (s + 1) * std::sin(0.5 + i - 1.5 * j);
                      }));
    kfac.step(Space());
    auto h = to_host(grad);
    run.gradients.emplace_back(h.data(), h.data() + h.size());
  }
  run.report = kfac.strategy_report();
  return run;
}

// Every rank's float gradients are `run`'s bit for bit, and equal `plain`'s (one process,
// double P) up to rounding P to float first when `narrow`.
inline void check_same_p_everywhere(dist::Communicator &comm, const FloatRun &run,
                                    const FloatRun &plain, bool narrow) {
  for (std::size_t s = 0; s < run.gradients.size(); ++s) {
    const std::vector<float> &mine = run.gradients[s];
    Vector<float, Mem> local("local", mine.size()), all("all", mine.size() * comm.size());
    Kokkos::deep_copy(local,
                      Kokkos::View<const float *, Kokkos::HostSpace>(mine.data(), mine.size()));
    comm.allgather(Space(), local, all);
    const auto h = to_host(all);
    for (std::size_t k = 0; k < h.size(); ++k) {
      CHECK(h(k) == mine[k % mine.size()]);
    }
    for (std::size_t k = 0; k < mine.size(); ++k) {
      CHECK(mine[k] == Approx(plain.gradients[s][k]).epsilon(narrow ? 1e-6 : 1e-7).margin(1e-9));
    }
  }
}

} // namespace kat::test::dist_kfac
