// kat::sparse: densities (uniform, ERK), masks, SET and RigL updates against a host reference,
// the masked weights and optimizer state, the Trainer's step, state, and agreement over ranks.
#include "test_helpers.hpp"

#include <kat/data/data_loader.hpp>
#include <kat/data/dataset.hpp>
#include <kat/nn/activation.hpp>
#include <kat/nn/dense.hpp>
#include <kat/nn/flatten.hpp>
#include <kat/nn/sequential.hpp>
#include <kat/optim/adam.hpp>
#include <kat/optim/sgd.hpp>
#include <kat/sparse/agent.hpp>
#include <kat/sparse/agent_probe.hpp>
#include <kat/sparse/density.hpp>
#include <kat/sparse/mask.hpp>
#include <kat/sparse/sparse_training.hpp>
#include <kat/train/trainer.hpp>

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#ifdef KAT_ENABLE_MPI
#include "mpi_test_helpers.hpp"
#include <kat/distributed/comm/process_group.hpp>
#include <kat/distributed/data_parallel/data_parallel.hpp>
#include <kat/distributed/data_parallel/distributed_sampler.hpp>
#endif

namespace test_sparse {

using namespace kat;
using namespace kat::test;

namespace {

using sparse::SparseInit;
using sparse::SparseMethod;
using Spec = nn::ParameterSpec;

template <class T> std::vector<T> host_vector(const Vector<T, Mem> &v) {
  const auto h = to_host(v);
  return std::vector<T>(h.data(), h.data() + h.extent(0));
}

// 60 samples of 6 features in 3 classes, deterministic.
data::Dataset sparse_toy_data(std::size_t n = 60) { return toy_dataset(n, 777); }

template <class Scalar> nn::Sequential<Scalar, Mem> sparse_toy_model() {
  nn::Sequential<Scalar, Mem> m(FeatureShape{6, 1, 1});
  m.template add<nn::Flatten>();
  m.template add<nn::Dense>(6, 16);
  m.template add<nn::ReLU>();
  m.template add<nn::Dense>(16, 3);
  m.compile(Space(), 5);
  return m;
}

} // namespace

TEST_CASE("sparse: uniform and ERK densities", "[sparse]") {
  const std::vector<std::vector<std::size_t>> shapes{{300, 784}, {100, 300}, {10, 100}};
  const std::vector<double> sizes{300.0 * 784, 100.0 * 300, 10.0 * 100};
  const double total = sizes[0] + sizes[1] + sizes[2];

  const auto uniform = sparse::layer_densities(shapes, 0.1, SparseInit::uniform);
  CHECK(uniform == std::vector<double>{0.1, 0.1, 0.1});

  for (const double density : {0.02, 0.05, 0.1, 0.3}) {
    INFO("density " << density);
    const auto p = sparse::layer_densities(shapes, density, SparseInit::erk);
    double active = 0;
    for (std::size_t l = 0; l < p.size(); ++l) {
      CHECK(p[l] > 0.0);
      CHECK(p[l] <= 1.0);
      active += p[l] * sizes[l];
    }
    CHECK(active == Approx(density * total).epsilon(1e-12));
    // Among the layers that are not dense, p_l / p_m = (Σdims_l / Πdims_l) / (Σdims_m / Πdims_m).
    const double raw0 = (300.0 + 784) / sizes[0], raw1 = (100.0 + 300) / sizes[1];
    if (p[1] < 1.0) {
      CHECK(p[0] / p[1] == Approx(raw0 / raw1).epsilon(1e-12));
    }
  }

  // A small layer whose ERK density would exceed 1 is made dense and the rest take up the
  // remaining budget: with 30 + 10^6 entries at density 0.5 the large one gets
  // (0.5 · 1000030 - 30) / 10^6.
  const auto p = sparse::layer_densities({{10, 3}, {1000, 1000}}, 0.5, SparseInit::erk);
  CHECK(p[0] == 1.0);
  CHECK(p[1] == Approx((0.5 * 1000030 - 30) / 1e6).epsilon(1e-12));

  CHECK(sparse::layer_densities(shapes, 1.0, SparseInit::erk) == std::vector<double>{1, 1, 1});
  CHECK_THROWS_MATCHES(sparse::layer_densities(shapes, 0.0, SparseInit::erk), Error,
                       MessageContains("density must be in (0, 1], got 0"));
  CHECK_THROWS_MATCHES(sparse::layer_densities(shapes, 1.5, SparseInit::uniform), Error,
                       MessageContains("density must be in (0, 1], got 1.5"));
  CHECK_THROWS_MATCHES(sparse::layer_densities({{3, 0}}, 0.5, SparseInit::erk), Error,
                       MessageContains("tensor 0 has a zero extent"));
  CHECK(sparse::parse_sparse_init("erk") == SparseInit::erk);
  CHECK_THROWS_MATCHES(sparse::parse_sparse_init("er"), Error,
                       MessageContains("must be 'uniform' or 'erk', got 'er'"));
  CHECK_THROWS_MATCHES(sparse::parse_sparse_method("snip"), Error,
                       MessageContains("must be 'static', 'set' or 'rigl', got 'snip'"));
}

TEST_CASE("sparse: a mask's initial pattern and what it masks", "[sparse]") {
  const Space space;
  auto model = sparse_toy_model<float>();
  const auto tensors = sparse::default_masked_tensors(model.parameter_specs());
  // The two weight matrices, not the biases.
  REQUIRE(tensors.size() == 2);
  CHECK(tensors[0].name == "1.weight");
  CHECK(tensors[1].name == "3.weight");

  sparse::Mask<float, Mem> mask(model.parameter_count(), tensors);
  CHECK(mask.density() == 1.0);
  mask.initialize({0.25, 0.5}, 42);
  CHECK(mask.active_count(0) == 24); // round(0.25 · 96)
  CHECK(mask.active_count(1) == 24); // round(0.5 · 48)
  CHECK(mask.density() == Approx(48.0 / 144.0));
  const auto host = mask.host();
  CHECK(host_vector(Vector<std::uint8_t, Mem>(mask.active())) == host);
  // Entries outside the masked tensors (the biases) stay active.
  std::size_t outside_inactive = 0;
  std::vector<bool> inside(host.size(), false);
  for (const auto &t : tensors) {
    std::fill(inside.begin() + t.offset, inside.begin() + t.offset + t.size(), true);
  }
  for (std::size_t i = 0; i < host.size(); ++i) {
    outside_inactive += (!inside[i] && host[i] == 0) ? 1 : 0;
  }
  CHECK(outside_inactive == 0);

  // The same seed draws the same pattern; another seed another one.
  sparse::Mask<float, Mem> same(model.parameter_count(), tensors), other(same);
  same.initialize({0.25, 0.5}, 42);
  other.initialize({0.25, 0.5}, 43);
  CHECK(same.host() == host);
  CHECK(other.host() != host);

  // Parameters, gradients and the optimizer's state are zeroed where the mask is 0 only.
  optim::Adam<float, Mem> adam(model.parameter_count());
  Kokkos::deep_copy(adam.exp_avg(), 1.0f);
  Kokkos::deep_copy(adam.exp_avg_sq(), 2.0f);
  const auto before = host_vector(model.parameters());
  mask.apply(space, model.parameters(), adam);
  const auto after = host_vector(model.parameters());
  const auto m = host_vector(adam.exp_avg()), v = host_vector(adam.exp_avg_sq());
  for (std::size_t i = 0; i < host.size(); ++i) {
    CHECK(after[i] == (host[i] ? before[i] : 0.0f));
    CHECK(m[i] == (host[i] ? 1.0f : 0.0f));
    CHECK(v[i] == (host[i] ? 2.0f : 0.0f));
  }

  CHECK_THROWS_MATCHES(mask.initialize({0.5}, 1), Error,
                       MessageContains("densities.size() must be 2"));
  CHECK_THROWS_MATCHES(mask.apply(space, Vector<float, Mem>("short", 3)), Error,
                       MessageContains("vector length must be"));
  std::vector<std::uint8_t> bad = host;
  bad[model.parameter_count() - 1] = 0; // the last bias
  CHECK_THROWS_MATCHES(mask.set(bad), Error, MessageContains("must be 1 (it is outside"));
  CHECK(mask.host() == host); // a refused mask changes nothing
  CHECK_THROWS_MATCHES(
      (sparse::Mask<float, Mem>(10, {Spec{"w", nn::ParameterRole::weight, {3, 4}, 0}})), Error,
      MessageContains("tensor 'w' covers [0, 12)"));
}

namespace {

// The update of one tensor computed independently: full sorts instead of selections.
struct ReferenceUpdate {
  std::vector<std::uint8_t> mask;
  std::vector<std::size_t> dropped, grown;
};

ReferenceUpdate reference_rigl(const std::vector<std::uint8_t> &mask, const std::vector<float> &w,
                               const std::vector<float> &g, double f) {
  ReferenceUpdate r{mask, {}, {}};
  std::vector<std::size_t> active;
  for (std::size_t i = 0; i < mask.size(); ++i) {
    if (mask[i]) {
      active.push_back(i);
    }
  }
  const auto k = static_cast<std::size_t>(std::floor(f * double(active.size())));
  std::stable_sort(active.begin(), active.end(),
                   [&](std::size_t a, std::size_t b) { return std::abs(w[a]) < std::abs(w[b]); });
  r.dropped.assign(active.begin(), active.begin() + std::ptrdiff_t(k));
  for (const auto i : r.dropped) {
    r.mask[i] = 0;
  }
  std::vector<std::size_t> candidates;
  for (std::size_t i = 0; i < mask.size(); ++i) {
    if (!r.mask[i]) {
      candidates.push_back(i);
    }
  }
  std::stable_sort(candidates.begin(), candidates.end(),
                   [&](std::size_t a, std::size_t b) { return std::abs(g[a]) > std::abs(g[b]); });
  for (std::size_t i = 0; i < k; ++i) {
    r.mask[candidates[i]] = 1;
    if (!mask[candidates[i]]) {
      r.grown.push_back(candidates[i]);
    }
  }
  return r;
}

} // namespace

TEST_CASE("sparse: a RigL update against a host reference", "[sparse]") {
  const Space space;
  // One 8 x 10 weight tensor at density 0.5 in a vector of 90 (10 more entries unmasked).
  const std::size_t n = 90;
  const std::vector<Spec> tensors{{"w", nn::ParameterRole::weight, {8, 10}, 5}};
  sparse::SparseTrainingOptions o;
  o.method = SparseMethod::rigl;
  o.density = 0.5;
  o.init = SparseInit::uniform;
  o.drop_fraction = 0.3;
  o.delta_t = 10;
  o.t_end = 0.75;
  sparse::SparseTraining<float, Mem> rigl(n, tensors, o);
  rigl.set_total_steps(100); // T_end = 75
  CHECK(rigl.end_step() == 75);
  CHECK_FALSE(rigl.is_update_step(0));
  CHECK_FALSE(rigl.is_update_step(15));
  CHECK(rigl.is_update_step(10));
  CHECK(rigl.is_update_step(70));
  CHECK_FALSE(rigl.is_update_step(80));
  const double pi = std::acos(-1.0);
  CHECK(rigl.drop_fraction_at(30) == Approx(0.15 * (1 + std::cos(pi * 30 / 75))));
  CHECK(rigl.drop_fraction_at(0) == Approx(0.3));
  CHECK(rigl.drop_fraction_at(75) == 0.0);

  // Distinct magnitudes, so the reference's order is the only one.
  const auto params = vector_of<float>(n, [](std::size_t i) {
    return (i % 2 ? -1.0 : 1.0) * (0.01 + double((i * 37) % 90) / 100.0);
  });
  const auto grads = vector_of<float>(n, [](std::size_t i) {
    return (i % 3 ? 1.0 : -1.0) * (0.02 + double((i * 53) % 90) / 50.0);
  });
  optim::SGD<float, Mem>::Options so;
  so.momentum = 0.9;
  optim::SGD<float, Mem> sgd(n, so);
  Kokkos::deep_copy(sgd.momentum_buffer(), 0.5f);
  rigl.begin(space, params, &sgd);

  const auto mask0 = rigl.mask().host();
  const auto w0 = host_vector(params), g0 = host_vector(grads);
  REQUIRE(rigl.mask().active_count(0) == 40);
  const std::vector<std::uint8_t> m0(mask0.begin() + 5, mask0.begin() + 85);
  const std::vector<float> wt(w0.begin() + 5, w0.begin() + 85), gt(g0.begin() + 5, g0.begin() + 85);
  const double f = rigl.drop_fraction_at(30);
  const auto ref = reference_rigl(m0, wt, gt, f);

  const bool take = rigl.after_backward(space, 30, params, grads, &sgd);
  CHECK_FALSE(take); // the optimizer step is skipped at an update
  const auto mask1 = rigl.mask().host();
  CHECK(std::vector<std::uint8_t>(mask1.begin() + 5, mask1.begin() + 85) == ref.mask);
  CHECK(rigl.mask().active_count(0) == 40); // unchanged by the update
  REQUIRE(rigl.last_update().dropped.size() == 1);
  CHECK(rigl.last_update().dropped[0] == std::size_t(std::floor(f * 40)));
  CHECK(rigl.last_update().dropped[0] == ref.dropped.size());
  CHECK(rigl.last_update().grown[0] == ref.grown.size());
  CHECK_FALSE(ref.grown.empty());

  const auto w1 = host_vector(params), g1 = host_vector(grads),
             mom = host_vector(sgd.momentum_buffer());
  for (std::size_t i = 0; i < n; ++i) {
    const bool inside = i >= 5 && i < 85;
    const bool active = mask1[i] != 0;
    const bool grown =
        inside && std::find(ref.grown.begin(), ref.grown.end(), i - 5) != ref.grown.end();
    INFO("entry " << i);
    if (!active || grown) {
      // Dropped and never-active weights are 0; regrown ones start at 0 with 0 momentum.
      CHECK(w1[i] == 0.0f);
      CHECK(mom[i] == 0.0f);
    } else {
      CHECK(w1[i] == w0[i]);
      CHECK(mom[i] == 0.5f);
    }
    CHECK(g1[i] == (active ? g0[i] : 0.0f)); // the gradient is masked after the update
  }
  // A step that is no update only masks the gradient.
  CHECK(rigl.after_backward(space, 31, params, grads, &sgd));
}

TEST_CASE("sparse: SET regrows at random from a shared seed", "[sparse]") {
  const Space space;
  const std::size_t n = 200;
  const std::vector<Spec> tensors{{"w", nn::ParameterRole::weight, {10, 20}, 0}};
  sparse::SparseTrainingOptions o;
  o.method = SparseMethod::set;
  o.density = 0.2;
  o.init = SparseInit::uniform;
  o.drop_fraction = 0.5;
  o.delta_t = 5;
  o.seed = 3;
  auto run = [&] {
    sparse::SparseTraining<float, Mem> set(n, tensors, o);
    set.set_total_steps(40);
    const auto params = vector_of<float>(n, [](std::size_t i) { return 0.1 + double(i) / 200; });
    const auto grads = vector_of<float>(n, [](std::size_t) { return 1.0; });
    set.begin(space, params, nullptr);
    const auto before = set.mask().host();
    CHECK_FALSE(set.after_backward(space, 5, params, grads, nullptr));
    const auto after = set.mask().host();
    CHECK(set.mask().active_count(0) == 40);
    // The 40 · 0.5 · (1 + cos(π 5 / 30)) / 2 smallest weights went: with w increasing in the
    // index, the lowest active indices.
    const auto drop = set.last_update().dropped[0];
    CHECK(drop == std::size_t(std::floor(40 * set.drop_fraction_at(5))));
    // The active entries past the `drop` lowest stay; the newly active ones are the grown.
    std::size_t seen = 0, fresh = 0;
    for (std::size_t i = 0; i < n; ++i) {
      if (before[i] && seen++ >= drop) {
        CHECK(after[i] == 1);
      }
      fresh += (after[i] && !before[i]) ? 1 : 0;
    }
    CHECK(fresh == set.last_update().grown[0]);
    CHECK(fresh <= drop);
    CHECK(fresh > 0);
    return after;
  };
  const auto a = run(), b = run();
  CHECK(a == b); // the same seed, the same mask
}

TEST_CASE("sparse: training keeps masked weights and their momentum at 0", "[sparse][train]") {
  const Space space;
  const auto data = sparse_toy_data();
  for (const auto method : {SparseMethod::static_mask, SparseMethod::set, SparseMethod::rigl}) {
    INFO(sparse::to_string(method));
    auto model = sparse_toy_model<float>();
    optim::SGD<float, Mem>::Options so;
    so.lr = 0.1;
    so.momentum = 0.9;
    optim::SGD<float, Mem> sgd(model.parameter_count(), so);
    data::DataLoader<float, Mem> loader(data, 8, true, 1);
    train::Trainer<float, Mem> trainer(model, sgd, loader);
    sparse::SparseTrainingOptions o;
    o.method = method;
    o.density = 0.3;
    o.delta_t = 4;
    o.t_end = 0.9;
    auto sp = std::make_shared<sparse::SparseTraining<float, Mem>>(model, o);
    const std::size_t active0 = sp->mask().active_total();
    trainer.add_callback(sp);
    trainer.fit(space, 3); // 24 steps: updates at 4, 8, ..., 20
    CHECK(sp->total_steps() == 24);
    CHECK(sp->updates() == (method == SparseMethod::static_mask ? 0 : 5));
    CHECK(sp->mask().active_total() == active0);
    const auto p = host_vector(model.parameters());
    const auto mom = host_vector(sgd.momentum_buffer());
    const auto &mask = sp->mask().host();
    std::size_t nonzero_inactive = 0;
    for (std::size_t i = 0; i < p.size(); ++i) {
      if (!mask[i]) {
        nonzero_inactive += (p[i] != 0.0f || mom[i] != 0.0f) ? 1 : 0;
      }
    }
    CHECK(nonzero_inactive == 0);
    // Skipped optimizer steps: SGD counted 24 - updates steps.
    CHECK(sgd.steps() == 24 - sp->updates());
  }
}

TEST_CASE("sparse: RigL on the sparse products equals RigL on the dense masked products",
          "[sparse][train]") {
  // The Trainer attaches the mask to the Dense layers, which at density 0.04 run the CSR
  // products; the hand-written loop never attaches, so its layers multiply densely.
  const Space space;
  const auto data = sparse_toy_data();
  sparse::SparseTrainingOptions o;
  o.method = SparseMethod::rigl;
  o.init = SparseInit::uniform;
  o.density = 0.04;
  o.delta_t = 3;
  optim::SGD<double, Mem>::Options so;
  so.lr = 0.1;
  so.momentum = 0.9;

  auto model = sparse_toy_model<double>();
  optim::SGD<double, Mem> sgd(model.parameter_count(), so);
  data::DataLoader<double, Mem> loader(data, 8, true, 2);
  train::Trainer<double, Mem> trainer(model, sgd, loader);
  auto sp = std::make_shared<sparse::SparseTraining<double, Mem>>(model, o);
  trainer.add_callback(sp);
  trainer.fit(space, 2);
  CHECK(sp->sparse_layers() == 2);
  CHECK(sp->updates() == 3); // steps 3, 6, 9 < T_end = 12

  auto ref = sparse_toy_model<double>();
  optim::SGD<double, Mem> ref_sgd(ref.parameter_count(), so);
  data::DataLoader<double, Mem> ref_loader(data, 8, true, 2);
  sparse::SparseTraining<double, Mem> ref_sp(ref, o);
  ref_sp.set_total_steps(16);
  ref_sp.begin(space, ref.parameters(), &ref_sgd);
  nn::SoftmaxCrossEntropy<double, Mem> ce;
  Matrix<double, Mem> x;
  Vector<std::int32_t, Mem> y;
  std::int64_t t = 0;
  for (std::size_t epoch = 0; epoch < 2; ++epoch) {
    ref_loader.start_epoch(epoch);
    while (ref_loader.next(space, x, y)) {
      ref_sp.begin_step(t);
      const auto &logits = ref.forward(space, x);
      Matrix<double, Mem> dl("dl", x.extent(0), logits.extent(1));
      ce.forward_backward(space, logits, y, dl);
      ref.backward(space, dl, nn::Sequential<double, Mem>::Gradients::overwrite);
      if (ref_sp.after_backward(space, t, ref.parameters(), ref.gradients(), &ref_sgd)) {
        ref_sgd.step(space, ref.parameters(), ref.gradients());
      }
      ref_sp.after_step(space, ref.parameters(), ref_sgd);
      ++t;
    }
  }
  CHECK(sp->mask().host() == ref_sp.mask().host());
  const auto p = host_vector(model.parameters()), r = host_vector(ref.parameters());
  for (std::size_t i = 0; i < p.size(); ++i) {
    INFO("parameter " << i);
    CHECK(p[i] == Approx(r[i]).epsilon(1e-10).margin(1e-13));
  }
}

TEST_CASE("sparse: density 1 without updates is plain training bit for bit", "[sparse][train]") {
  const Space space;
  const auto data = sparse_toy_data();
  auto run = [&](bool with_sparse) {
    auto model = sparse_toy_model<double>();
    optim::Adam<double, Mem> adam(model.parameter_count());
    data::DataLoader<double, Mem> loader(data, 8, true, 1);
    train::Trainer<double, Mem> trainer(model, adam, loader);
    if (with_sparse) {
      sparse::SparseTrainingOptions o;
      o.method = SparseMethod::static_mask;
      o.density = 1.0;
      trainer.add_callback(std::make_shared<sparse::SparseTraining<double, Mem>>(model, o));
    }
    trainer.fit(space, 2);
    return host_vector(model.parameters());
  };
  CHECK(run(true) == run(false));
}

TEST_CASE("sparse: state round trip and refused states", "[sparse]") {
  const std::vector<Spec> tensors{{"w", nn::ParameterRole::weight, {6, 5}, 0}};
  sparse::SparseTrainingOptions o;
  o.density = 0.4;
  o.init = SparseInit::uniform;
  sparse::SparseTraining<float, Mem> a(40, tensors, o);
  o.seed = 9;
  sparse::SparseTraining<float, Mem> b(40, tensors, o);
  REQUIRE(a.mask().host() != b.mask().host());
  b.load_state_dict(a.state_dict());
  CHECK(b.mask().host() == a.mask().host());
  CHECK(b.mask().active_count(0) == 12);

  auto values = a.state_dict().get_vector<std::uint8_t>("active", {40});
  values[35] = 0; // outside the tensor
  StateDict bad;
  bad.set("active", values);
  bad.set("updates", std::int64_t(0));
  const auto kept = b.mask().host();
  CHECK_THROWS_MATCHES(b.load_state_dict(bad), Error, MessageContains("entry 35 must be 1"));
  CHECK(b.mask().host() == kept);
  StateDict missing;
  missing.set("active", a.mask().host());
  CHECK_THROWS_AS(b.load_state_dict(missing), StateError);

  o.delta_t = 0;
  CHECK_THROWS_MATCHES((sparse::SparseTraining<float, Mem>(40, tensors, o)), Error,
                       MessageContains("delta_t must be >= 1, got 0"));
  o.delta_t = 10;
  o.drop_fraction = 1.5;
  CHECK_THROWS_MATCHES((sparse::SparseTraining<float, Mem>(40, tensors, o)), Error,
                       MessageContains("drop_fraction must be in [0, 1], got 1.5"));
}

TEST_CASE("sparse: AGENT in a Trainer corrects the first step as the closed form",
          "[sparse][agent][train]") {
  // Right after the refresh θ = θ̃, so the first step's corrected gradient is
  // ∇L_b + γτ0(μ̃ − ∇L_b) with ∇L_b and μ̃ computed here by a separate model.
  const Space space;
  const auto data = sparse_toy_data();
  using DModel = nn::Sequential<double, Mem>;
  using DLoader = data::DataLoader<double, Mem>;
  sparse::AGENTOptions ao;
  ao.gamma = 0.5;
  ao.tau0 = 0.8;

  DModel model = sparse_toy_model<double>(), probe = sparse_toy_model<double>();
  optim::SGD<double, Mem> sgd(model.parameter_count());
  DLoader loader(data, 8, true, 1), refresh_loader(data, 16, false, 0);
  train::Trainer<double, Mem> trainer(model, sgd, loader);
  auto agent = std::make_shared<sparse::AGENT<double, Mem>>(model.parameter_count(), ao);
  trainer.add_callback(
      std::make_shared<sparse::AGENTProbe<double, Mem>>(agent, probe, refresh_loader));
  trainer.add_transform(agent);
  struct First : train::GradientTransform<double, Mem> {
    std::vector<double> g;
    std::string name() const override { return "first"; }
    void transform(const Space &, const vector_type &, const vector_type &grads) override {
      if (g.empty()) {
        g = host_vector(grads);
      }
    }
  };
  auto first = std::make_shared<First>();
  trainer.add_transform(first);
  const auto theta = host_vector(model.parameters());
  trainer.fit(space, 1);
  CHECK(agent->refreshes() == 1);

  // The reference: the same network at θ, its gradient on batch 0 of the shuffled loader and
  // the sample-weighted mean gradient over all 60 samples.
  DModel ref = sparse_toy_model<double>();
  REQUIRE(host_vector(ref.parameters()) == theta);
  nn::SoftmaxCrossEntropy<double, Mem> ce;
  const auto gradient_of = [&](const Matrix<double, Mem> &x, const Vector<std::int32_t, Mem> &y) {
    const auto &logits = ref.forward(space, x);
    Matrix<double, Mem> dl("dl", x.extent(0), logits.extent(1));
    ce.forward_backward(space, logits, y, dl);
    ref.backward(space, dl, DModel::Gradients::overwrite);
    return host_vector(ref.gradients());
  };
  Matrix<double, Mem> x;
  Vector<std::int32_t, Mem> y;
  DLoader batches(data, 8, true, 1);
  batches.start_epoch(0);
  REQUIRE(batches.next(space, x, y));
  const auto g0 = gradient_of(x, y);
  std::vector<double> mu(g0.size(), 0.0);
  DLoader all(data, 7, false, 0); // other batches than the refresh's: only the mean matters
  all.start_epoch(0);
  while (all.next(space, x, y)) {
    const auto g = gradient_of(x, y);
    for (std::size_t i = 0; i < mu.size(); ++i) {
      mu[i] += g[i] * double(x.extent(0)) / 60.0;
    }
  }
  const double c = 0.5 * 0.8;
  REQUIRE(first->g.size() == g0.size());
  for (std::size_t i = 0; i < g0.size(); ++i) {
    INFO("parameter " << i);
    CHECK(first->g[i] == Approx(g0[i] + c * (mu[i] - g0[i])).epsilon(1e-10).margin(1e-13));
  }
}

#ifdef KAT_ENABLE_MPI
TEST_CASE("sparse: RigL and SET with data parallel give the same mask and weights everywhere",
          "[mpi][sparse]") {
  auto comm = distributed::Communicator::world();
  INFO(rank_of(comm));
  const Space space;
  const auto data = sparse_toy_data(192);
  const std::size_t local = 48 / std::size_t(comm.size()); // 4 steps an epoch at 1 to 4 ranks
  const distributed::DistributedSampler sampler(data.size(), comm.rank(), comm.size(), 4);
  for (const auto method : {SparseMethod::rigl, SparseMethod::set}) {
    INFO(sparse::to_string(method));
    auto model = sparse_toy_model<double>();
    optim::SGD<double, Mem>::Options so;
    so.lr = 0.1;
    so.momentum = 0.9;
    optim::SGD<double, Mem> sgd(model.parameter_count(), so);
    data::DataLoader<double, Mem> loader(data, local, true, 4);
    train::Trainer<double, Mem> trainer(model, sgd, loader);
    trainer.set_process_group(std::make_shared<distributed::MPIProcessGroup>(comm));
    trainer.set_gradient_sync(
        std::make_shared<distributed::DataParallel<double, Mem>>(comm, model));
    trainer.set_epoch_order([&sampler](std::size_t e) { return sampler.indices(e); });
    sparse::SparseTrainingOptions o;
    o.method = method;
    o.density = 0.25;
    o.delta_t = 3;
    o.seed = 11;
    auto sp = std::make_shared<sparse::SparseTraining<double, Mem>>(model, o);
    trainer.add_callback(sp);
    // RigL also with AGENT: its refresh over the rank's shard, its per-step gradient averaged.
    auto probe = sparse_toy_model<double>();
    std::vector<std::size_t> shard;
    for (std::size_t i = std::size_t(comm.rank()); i < data.size(); i += std::size_t(comm.size())) {
      shard.push_back(i);
    }
    data::DataLoader<double, Mem> refresh_loader(data, local, false, 0);
    auto agent_comm = std::make_shared<distributed::Communicator>(comm.dup());
    auto agent = std::make_shared<sparse::AGENT<double, Mem>>(model.parameter_count());
    if (method == SparseMethod::rigl) {
      trainer.add_callback(std::make_shared<sparse::AGENTProbe<double, Mem>>(
          agent, probe, refresh_loader, shard,
          [agent_comm](const Space &s, const Vector<double, Mem> &g) {
            agent_comm->average(s, g);
          }));
      trainer.add_transform(agent);
    }
    trainer.fit(space, 3); // 12 steps: updates at 3, 6
    CHECK(sp->updates() == 2);
    if (method == SparseMethod::rigl) {
      CHECK(agent->refreshes() == 3);
      CHECK(agent->last_refresh().samples == 192); // the shards cover the data set once
    }
    // Bit for bit: the bytes of the mask and of the parameters agree over the ranks.
    const auto p = host_vector(model.parameters());
    const auto &m = sp->mask().host();
    std::string bytes(reinterpret_cast<const char *>(p.data()), p.size() * sizeof(double));
    bytes.append(reinterpret_cast<const char *>(m.data()), m.size());
    CHECK(same_on_every_rank(comm, bytes));
  }
}
#endif

} // namespace test_sparse
