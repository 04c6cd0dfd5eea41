// kat::train: the Trainer against a hand-written loop, the order of the roles, callbacks,
// state and resume, checkpoints, metrics and the registry.
#include "test_helpers.hpp"

#include <kat/data/data_loader.hpp>
#include <kat/data/dataset.hpp>
#include <kat/io/checkpoint.hpp>
#include <kat/nn/activation.hpp>
#include <kat/nn/dense.hpp>
#include <kat/nn/flatten.hpp>
#include <kat/optim/adam.hpp>
#include <kat/optim/lr_schedule.hpp>
#include <kat/optim/sgd.hpp>
#include <kat/precond/kfac.hpp>
#include <kat/train/checkpointer.hpp>
#include <kat/train/console_logger.hpp>
#include <kat/train/kfac_transform.hpp>
#include <kat/train/lr_schedules.hpp>
#include <kat/train/metrics_writer.hpp>
#include <kat/train/registry.hpp>
#include <kat/train/trainer.hpp>

#include <KokkosBlas1_scal.hpp>
#include <catch2/catch.hpp>

#include <array>
#include <cstdio>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <unistd.h>
#include <vector>

#ifdef KAT_ENABLE_MPI
#include "mpi_test_helpers.hpp"

#include <kat/distributed/comm/process_group.hpp>
#include <kat/distributed/data_parallel/data_parallel.hpp>
#include <kat/distributed/data_parallel/distributed_sampler.hpp>
#endif

namespace test_trainer {

using namespace kat;
using namespace kat::test;

namespace {

using Model = nn::Sequential<float, Mem>;
using Loader = data::DataLoader<float, Mem>;
using Trainer = train::Trainer<float, Mem>;

// 50 samples of 6 features in 3 classes, deterministic; 50 / 8 gives a short last batch.
data::Dataset toy_data(std::size_t n = 50) { return toy_dataset(n, 12345); }

template <class Scalar = float> nn::Sequential<Scalar, Mem> toy_model() {
  nn::Sequential<Scalar, Mem> m(FeatureShape{6, 1, 1});
  m.template add<nn::Flatten>();
  m.template add<nn::Dense>(6, 8);
  m.template add<nn::ReLU>();
  m.template add<nn::Dense>(8, 3);
  m.compile(Space(), 3);
  return m;
}

optim::SGD<float, Mem>::Options sgd_options() {
  optim::SGD<float, Mem>::Options o;
  o.lr = 0.1;
  o.momentum = 0.9;
  return o;
}

std::vector<float> params_of(const Model &m) {
  const auto h = to_host(m.parameters());
  return std::vector<float>(h.data(), h.data() + h.extent(0));
}

// A transform that doubles the gradient and counts its calls.
struct Doubler : train::GradientTransform<float, Mem> {
  int calls = 0;
  std::string name() const override { return "doubler"; }
  void transform(const Space &space, const vector_type &, const vector_type &g) override {
    ++calls;
    KokkosBlas::scal(g, 2.0f, g);
    (void)space;
  }
};

// Records every hook of the step's roles, in order.
struct Recorder : train::Callback<float, Mem>, train::GradientSync<float, Mem> {
  std::vector<std::string> log;
  std::string name() const override { return "recorder"; }
  void on_train_begin(Trainer &) override { log.push_back("train_begin"); }
  void on_epoch_begin(Trainer &t) override {
    log.push_back("epoch_begin " + std::to_string(t.position().epoch));
  }
  void on_step_begin(Trainer &) override { log.push_back("step_begin"); }
  void on_after_backward(Trainer &) override { log.push_back("after_backward"); }
  void on_step_end(Trainer &t) override {
    log.push_back("step_end " + std::to_string(t.position().step));
  }
  void on_epoch_end(Trainer &, train::EpochSummary &s) override {
    log.push_back("epoch_end " + std::to_string(s.epoch));
  }
  void on_train_end(Trainer &) override { log.push_back("train_end"); }
  void on_gradients_ready(const Space &, std::size_t layer) override {
    log.push_back("ready " + std::to_string(layer));
  }
  void before_step(const Space &) override { log.push_back("before_step"); }
  void after_step(const Space &) override { log.push_back("after_step"); }
  void reset_stats() override { log.push_back("reset_stats"); }
};

std::string temp_dir() {
  char tmpl[] = "/tmp/kat_test_trainer_XXXXXX";
  REQUIRE(mkdtemp(tmpl) != nullptr);
  return tmpl;
}

} // namespace

TEST_CASE("trainer: one epoch equals the hand-written loop bit for bit", "[train]") {
  const Space space;
  const auto data = toy_data();
  const auto schedule = optim::cosine_lr(0.1, 14);

  // The loop of docs/guide.md, written out.
  Model ref = toy_model();
  optim::SGD<float, Mem> ref_opt(ref.parameter_count(), sgd_options());
  Loader ref_loader(data, 8, true, 7);
  nn::SoftmaxCrossEntropy<float, Mem> ce;
  Matrix<float, Mem> x;
  Vector<std::int32_t, Mem> y;
  std::int64_t step = 0;
  double ref_loss = 0;
  for (std::size_t epoch = 0; epoch < 2; ++epoch) {
    ref_loader.start_epoch(epoch);
    ref_loss = 0;
    while (ref_loader.next(space, x, y)) {
      const auto &logits = ref.forward(space, x);
      Matrix<float, Mem> dlogits("dlogits", x.extent(0), 3);
      ref_loss += ce.forward_backward(space, logits, y, dlogits) * double(x.extent(0));
      ref.backward(space, dlogits, Model::Gradients::overwrite);
      KokkosBlas::scal(ref.gradients(), 2.0f, ref.gradients()); // what Doubler does
      ref_opt.set_lr(schedule(step++));
      ref_opt.step(space, ref.parameters(), ref.gradients());
    }
  }

  Model model = toy_model();
  optim::SGD<float, Mem> opt(model.parameter_count(), sgd_options());
  Loader loader(data, 8, true, 7);
  Trainer trainer(model, opt, loader);
  trainer.set_lr(schedule);
  auto doubler = std::make_shared<Doubler>();
  trainer.add_transform(doubler);
  struct Last : train::Callback<float, Mem> {
    train::EpochSummary summary;
    std::string name() const override { return "last"; }
    void on_epoch_end(Trainer &, train::EpochSummary &s) override { summary = s; }
  };
  auto last = std::make_shared<Last>();
  trainer.add_callback(last);
  trainer.fit(space, 2);

  CHECK(params_of(model) == params_of(ref));
  CHECK(doubler->calls == 14); // 2 epochs of ceil(50 / 8) steps
  CHECK(trainer.position().step == 14);
  CHECK(trainer.position().epoch == 3);
  CHECK(opt.lr() == schedule(13));
  CHECK(last->summary.epoch == 2);
  CHECK(last->summary.train_loss == Approx(ref_loss / 50).epsilon(1e-12));
  CHECK(last->summary.lr == schedule(13));
  CHECK(last->summary.test_accuracy == 0); // no test loader
}

TEST_CASE("trainer: roles and callbacks run in the documented order", "[train]") {
  const auto data = toy_data(16);
  Model model = toy_model();
  optim::SGD<float, Mem> opt(model.parameter_count(), sgd_options());
  Loader loader(data, 8, false, 0);
  Trainer trainer(model, opt, loader);
  auto rec = std::make_shared<Recorder>();
  trainer.set_gradient_sync(rec);
  trainer.add_callback(rec);
  trainer.fit(Space(), 1);
  // Dense layers are blocks 1 and 3 of the flat buffer; backward reports every layer, last
  // first.
  const std::vector<std::string> step{"step_begin", "ready 3",     "ready 2",        "ready 1",
                                      "ready 0",    "before_step", "after_backward", "after_step"};
  std::vector<std::string> expected{"train_begin", "reset_stats", "epoch_begin 1"};
  for (int s = 1; s <= 2; ++s) {
    expected.insert(expected.end(), step.begin(), step.end());
    expected.push_back("step_end " + std::to_string(s));
  }
  expected.insert(expected.end(), {"epoch_end 1", "train_end"});
  CHECK(rec->log == expected);
}

TEST_CASE("trainer: a skipped optimizer step runs no transform and keeps the parameters",
          "[train]") {
  const auto data = toy_data(16);
  Model model = toy_model();
  optim::SGD<float, Mem> opt(model.parameter_count(), sgd_options());
  Loader loader(data, 8, false, 0);
  Trainer trainer(model, opt, loader);
  auto doubler = std::make_shared<Doubler>();
  trainer.add_transform(doubler);
  struct SkipFirst : train::Callback<float, Mem> {
    std::vector<float> before, after;
    std::string name() const override { return "skip_first"; }
    void on_after_backward(Trainer &t) override {
      if (t.position().step == 0) {
        before = params_of(t.model());
        t.skip_optimizer_step();
      }
    }
    void on_step_end(Trainer &t) override {
      if (t.position().step == 1) {
        after = params_of(t.model());
      }
    }
  };
  auto skip = std::make_shared<SkipFirst>();
  trainer.add_callback(skip);
  trainer.fit(Space(), 1);
  CHECK(skip->after == skip->before);
  CHECK(doubler->calls == 1);
  CHECK(opt.steps() == 1);
  CHECK(trainer.position().step == 2); // the skipped step still counts
}

TEST_CASE("trainer: request_stop ends training after the epoch", "[train]") {
  Model model = toy_model();
  optim::SGD<float, Mem> opt(model.parameter_count(), sgd_options());
  const auto data = toy_data(16);
  Loader loader(data, 8, false, 0);
  Trainer trainer(model, opt, loader);
  struct Stopper : train::Callback<float, Mem> {
    std::string name() const override { return "stopper"; }
    void on_epoch_end(Trainer &t, train::EpochSummary &s) override {
      if (s.epoch == 2) {
        t.request_stop();
      }
    }
  };
  trainer.add_callback(std::make_shared<Stopper>());
  int hooked = 0; // without a gradient sync, the trainer leaves the caller's hook alone
  model.set_backward_hook([&hooked](std::size_t) { ++hooked; });
  trainer.fit(Space(), 5);
  CHECK(trainer.position().epoch == 3);
  CHECK(trainer.position().step == 4);
  CHECK(hooked == 4 * 4); // 4 steps, 4 layers each
}

TEST_CASE("trainer: a run resumed from a checkpoint inside an epoch ends bit-identical",
          "[train][checkpoint]") {
  const Space space;
  const auto data = toy_data();
  const auto run = [&](const std::string &dir, std::int64_t epochs, const std::string &resume) {
    Model model = toy_model();
    optim::Adam<float, Mem> opt(model.parameter_count(), {});
    Loader loader(data, 8, true, 11);
    Trainer trainer(model, opt, loader);
    trainer.set_lr(optim::linear_warmup(3, optim::constant_lr(0.01)));
    trainer.set_identity({{"model", "toy"}});
    auto doubler = std::make_shared<Doubler>();
    trainer.add_transform(doubler);
    train::ProcessGroup alone;
    auto ckpt = std::make_shared<train::Checkpointer<float, Mem>>(dir, 5, 100, alone);
    trainer.add_callback(ckpt);
    if (!resume.empty()) {
      train::resume(trainer, resume);
    }
    trainer.fit(space, epochs);
    return std::make_pair(params_of(model), opt.state_dict());
  };
  const std::string a = temp_dir(), b = temp_dir();
  const auto straight = run(a, 3, "");
  // Step 10 is inside epoch 2 (7 steps per epoch): batch 3 of it.
  const auto resumed = run(b, 3, a + "/" + io::CheckpointDirectory::file_name(10, 0, 1));
  CHECK(resumed.first == straight.first);
  CHECK(io::encode_checkpoint(resumed.second) == io::encode_checkpoint(straight.second));
  // Saved at steps 5, 10, 15 and after the last epoch (21); 14 ends epoch 2 and is not a
  // multiple of 5, so it is not saved.
  CHECK(io::CheckpointDirectory(a, 100).steps() == std::vector<std::int64_t>{5, 10, 15, 20, 21});

  // Refused checkpoints, checked against the same files (blocks, not SECTIONs: Catch2 would
  // train the two runs above again for every section).
  const std::string file = a + "/" + io::CheckpointDirectory::file_name(10, 0, 1);
  struct Fresh { // a run that has not started
    Model model = toy_model();
    optim::Adam<float, Mem> opt{model.parameter_count(), {}};
    Loader loader;
    Trainer trainer{model, opt, loader};
    explicit Fresh(const data::Dataset &d) : loader(d, 8, true, 11) {}
  };
  {
    INFO("a checkpoint of another configuration is refused before anything changes");
    Fresh f(data);
    f.trainer.set_identity({{"model", "other"}});
    f.trainer.add_transform(std::make_shared<Doubler>());
    const auto before = params_of(f.model);
    CHECK_THROWS_MATCHES(train::resume(f.trainer, file), ValueError,
                         MessageContains("written with model toy, this run has model other"));
    CHECK(params_of(f.model) == before);
    CHECK(f.trainer.position().step == 0);
  }
  {
    INFO("a state without a component's part is refused, naming the part");
    Fresh f(data);
    f.trainer.set_identity({{"model", "toy"}});
    struct Stateful : Doubler {
      std::string name() const override { return "stateful"; }
      StateDict state_dict() const override {
        StateDict s;
        s.set("calls", std::int64_t(calls));
        return s;
      }
    };
    f.trainer.add_transform(std::make_shared<Stateful>());
    CHECK_THROWS_MATCHES(train::resume(f.trainer, file), StateError,
                         MessageContains("'stateful' is missing"));
  }
}

TEST_CASE("trainer: the metrics writer's CSV and JSON lines", "[train]") {
  const std::string dir = temp_dir();
  train::EpochSummary s;
  s.epoch = 2;
  s.wall_seconds = 1.5;
  s.samples_per_second = 1000;
  s.train_loss = 0.25;
  s.test_loss = 0.5;
  s.test_accuracy = 0.875;
  s.lr = 0.01;
  s.metrics = {{"b", 3.25, 2}, {"a", 7, 0}};
  Model model = toy_model();
  optim::SGD<float, Mem> opt(model.parameter_count(), sgd_options());
  const auto data = toy_data(8);
  Loader loader(data, 8, false, 0);
  Trainer trainer(model, opt, loader);
  {
    train::MetricsWriter<float, Mem> csv(dir + "/m.csv", {"a", "b", "c"});
    train::MetricsWriter<float, Mem> json(dir + "/m.jsonl", {"a"});
    csv.on_epoch_end(trainer, s);
    json.on_epoch_end(trainer, s);
  }
  const auto read = [](const std::string &path) {
    std::ifstream in(path);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  };
  CHECK(read(dir + "/m.csv") ==
        "epoch,wall_seconds,samples_per_second,train_loss,test_loss,test_accuracy,lr,a,b,c\n"
        "2,1.500000,1000.0,0.250000,0.500000,0.875000,0.01,7,3.25,0.000000\n");
  CHECK(read(dir + "/m.jsonl") ==
        "{\"epoch\": 2, \"wall_seconds\": 1.500000, \"samples_per_second\": 1000.0, "
        "\"train_loss\": 0.250000, \"test_loss\": 0.500000, \"test_accuracy\": 0.875000, "
        "\"lr\": 0.01, \"a\": 7}\n");
  CHECK_THROWS_MATCHES((train::MetricsWriter<float, Mem>(dir + "/m.txt")), ValueError,
                       MessageContains("must end in .csv or .jsonl, got '" + dir + "/m.txt'"));
}

TEST_CASE("trainer: a metrics file or console that cannot be written throws naming it",
          "[train][errors]") {
  const std::string dir = temp_dir();
  // Names the writer accepts, pointing at a device where every write fails with ENOSPC.
  const std::string csv = dir + "/full.csv", jsonl = dir + "/full.jsonl";
  REQUIRE(symlink("/dev/full", csv.c_str()) == 0);
  REQUIRE(symlink("/dev/full", jsonl.c_str()) == 0);
  // The CSV header is written (and checked) at construction.
  CHECK_THROWS_MATCHES((train::MetricsWriter<float, Mem>(csv)), IOError,
                       MessageContains("writing '" + csv + "': No space left on device"));
  // JSON lines have no header: the first epoch's line fails.
  Model model = toy_model();
  optim::SGD<float, Mem> opt(model.parameter_count(), sgd_options());
  const auto data = toy_data(8);
  Loader loader(data, 8, false, 0);
  Trainer trainer(model, opt, loader);
  train::EpochSummary s;
  train::MetricsWriter<float, Mem> json(jsonl);
  CHECK(json.path() == jsonl);
  CHECK_THROWS_MATCHES(json.on_epoch_end(trainer, s), IOError,
                       MessageContains("writing '" + jsonl + "': No space left on device"));
  // The console's epoch line, to a stream that cannot take it.
  std::FILE *full = std::fopen("/dev/full", "w");
  REQUIRE(full != nullptr);
  {
    train::ConsoleLogger<float, Mem> logger(true, false, full, "the test's stream");
    CHECK_THROWS_MATCHES(logger.on_epoch_end(trainer, s), IOError,
                         MessageContains("writing the test's stream: No space left on device"));
    train::ConsoleLogger<float, Mem> quiet(false, false, full); // prints nothing: no error
    CHECK_NOTHROW(quiet.on_epoch_end(trainer, s));
  }
  std::fclose(full);
  // The same lines to a real file arrive whole.
  const std::string ok = dir + "/ok.txt";
  std::FILE *file = std::fopen(ok.c_str(), "w");
  REQUIRE(file != nullptr);
  s.epoch = 3;
  train::ConsoleLogger<float, Mem>(true, false, file).on_epoch_end(trainer, s);
  std::fclose(file);
  std::ifstream in(ok);
  std::string line;
  std::getline(in, line);
  CHECK(line.rfind("epoch  3  ", 0) == 0);
}

TEST_CASE("registry: option ranges are described and checked", "[train][registry]") {
  using R = train::OptionRange;
  CHECK(R::greater_than(0).describe() == "a number > 0");
  CHECK(R::at_least(1).describe() == "a number >= 1");
  CHECK(R::half_open(0, 1).describe() == "a number in [0, 1)");
  CHECK(R::closed(0, 0.5).describe() == "a number in [0, 0.5]");
  CHECK(R::integer_at_least(1).describe() == "an integer >= 1");
  const train::OptionSpec decay =
      train::OptionSpec("factor-decay", "decay", "0.95").within(R::half_open(0, 1));
  CHECK(train::option_value_error(decay, "0").empty());
  CHECK(train::option_value_error(decay, "0.999").empty());
  CHECK(train::option_value_error(decay, "1") == "must be a number in [0, 1), got '1'");
  CHECK(train::option_value_error(decay, "-0.1") == "must be a number in [0, 1), got '-0.1'");
  CHECK(train::option_value_error(decay, "nan") == "must be a number in [0, 1), got 'nan'");
  CHECK(train::option_value_error(decay, "0.5x") == "must be a number in [0, 1), got '0.5x'");
  CHECK(train::option_value_error(decay, "") == "must be a number in [0, 1), got ''");
  const train::OptionSpec steps =
      train::OptionSpec("steps", "steps", "10").within(R::integer_at_least(1));
  CHECK(train::option_value_error(steps, "1").empty());
  CHECK(train::option_value_error(steps, "0") == "must be an integer >= 1, got '0'");
  CHECK(train::option_value_error(steps, "2.5") == "must be an integer >= 1, got '2.5'");
  CHECK(train::option_value_error(steps, "99999999999999999999") ==
        "must be an integer >= 1, got '99999999999999999999'");
  CHECK(train::option_value_error(train::OptionSpec("free", "no range"), "anything").empty());
  CHECK_THROWS_MATCHES(train::check_option_value(steps, "-3"), ValueError,
                       MessageContains("option --steps must be an integer >= 1, got '-3'"));
}

TEST_CASE("trainer: argument errors", "[train][errors]") {
  Model model = toy_model();
  optim::SGD<float, Mem> wrong(model.parameter_count() + 1, sgd_options());
  const auto data = toy_data(8);
  Loader loader(data, 8, false, 0);
  CHECK_THROWS_AS(Trainer(model, wrong, loader), ShapeError);
  optim::SGD<float, Mem> opt(model.parameter_count(), sgd_options());
  Trainer trainer(model, opt, loader);
  CHECK_THROWS_MATCHES(trainer.fit(Space(), 0), ValueError,
                       MessageContains("epochs must be >= 1, got 0"));
  CHECK_THROWS_MATCHES(trainer.add_transform(nullptr), ValueError,
                       MessageContains("transform must not be null"));
  train::ProcessGroup alone;
  CHECK_THROWS_MATCHES((train::Checkpointer<float, Mem>(temp_dir(), -1, 3, alone)), ValueError,
                       MessageContains("every must be >= 0, got -1"));
}

TEST_CASE("registry: names and lookups and typed options", "[train][registry]") {
  train::Registry<std::function<int(const train::Config &)>> r("optimizer");
  r.add("sgd", "plain", {{"lr", "rate", "0.1"}},
        [](const train::Config &c) { return int(c.number("lr") * 10); });
  r.add("adam", "adaptive", {}, [](const train::Config &) { return 7; });
  CHECK(r.names() == std::vector<std::string>{"sgd", "adam"});
  CHECK_THROWS_MATCHES(r.add("sgd", "again", {}, {}), ValueError,
                       MessageContains("optimizer 'sgd' is already registered"));
  CHECK_THROWS_MATCHES(r.at("lion"), ValueError,
                       MessageContains("unknown optimizer 'lion' (registered: sgd, adam)"));
  train::Config c;
  c.set("lr", "0.3");
  CHECK(r.at("sgd").make(c) == 3);
  c.set("lr", "0.3x");
  CHECK_THROWS_MATCHES(c.number("lr"), ValueError,
                       MessageContains("option --lr must be a finite number, got '0.3x'"));
  c.set("steps", "12");
  CHECK(c.integer("steps") == 12);
  c.set("steps", "1.5");
  CHECK_THROWS_MATCHES(c.integer("steps"), ValueError,
                       MessageContains("--steps must be an integer"));
  c.set("layers", "0,3.1,Conv2d");
  CHECK(c.list("layers") == std::vector<std::string>{"0", "3.1", "Conv2d"});
  c.set("layers", "");
  CHECK(c.list("layers").empty());
  CHECK_FALSE(c.flag("nesterov"));
  CHECK_THROWS_MATCHES(c.text("momentum"), ValueError,
                       MessageContains("--momentum is needed here and has no default"));
}

TEST_CASE("trainer: K-FAC as a transform equals kfac.step in a hand-written loop",
          "[train][kfac]") {
  using KFAC = precond::KFAC<float, Mem>;
  const Space space;
  const auto data = toy_data();
  precond::KFACOptions k;
  k.factor_update_steps = 2;
  k.inv_update_steps = 4;
  k.damping = 0.01;
  k.lr = 0.1;
  // The loop of docs/guide.md with K-FAC.
  Model ref = toy_model();
  optim::SGD<float, Mem> ref_opt(ref.parameter_count(), sgd_options());
  KFAC ref_kfac(k);
  REQUIRE(ref_kfac.register_model(ref) == 2);
  Loader ref_loader(data, 8, true, 5);
  nn::SoftmaxCrossEntropy<float, Mem> ce;
  Matrix<float, Mem> x;
  Vector<std::int32_t, Mem> y;
  ref_loader.start_epoch(0);
  while (ref_loader.next(space, x, y)) {
    const auto &logits = ref.forward(space, x);
    Matrix<float, Mem> dlogits("dlogits", x.extent(0), 3);
    ce.forward_backward(space, logits, y, dlogits);
    ref.backward(space, dlogits, Model::Gradients::overwrite);
    ref_kfac.step(space);
    ref_opt.step(space, ref.parameters(), ref.gradients());
  }

  Model model = toy_model();
  optim::SGD<float, Mem> opt(model.parameter_count(), sgd_options());
  auto kfac = std::make_shared<KFAC>(k);
  kfac->register_model(model);
  auto transform = std::make_shared<train::KFACTransform<KFAC>>(kfac);
  CHECK(transform->stats().next_updates_curvature); // step 0 updates the factors
  Loader loader(data, 8, true, 5);
  Trainer trainer(model, opt, loader);
  trainer.add_transform(transform);
  trainer.fit(space, 1);
  CHECK(params_of(model) == params_of(ref));
  CHECK(kfac->steps() == 7);
  const auto stats = transform->stats();
  CHECK_FALSE(stats.next_updates_curvature); // step 7: 7 % 2 != 0
  CHECK(stats.bytes == 0);                   // the local strategy communicates nothing
  CHECK(stats.state_bytes == kfac->state_bytes());
  CHECK(transform->summary() ==
        "K-FAC on 2 layers (eigen path; factors float, decompositions double): "
        "factor_update_steps 2, inv_update_steps 4, damping 0.01, factor_decay 0.95, "
        "kl_clip 0.001");
  // Its state is the KFAC's, saved under "kfac.".
  CHECK(trainer.state_dict().sub("kfac").entries().size() == kfac->state_dict().entries().size());
}

TEST_CASE("trainer: the K-FAC transform preconditions the gradient it is given", "[train][kfac]") {
  // Two identical models with the same batches: one preconditioned in place through its
  // registered views (kfac.step), the other through the transform given a copy of its
  // gradient vector. The copy must come out as the first model's gradient, bit for bit, and
  // the second model's own gradient must stay as backward left it.
  using KFAC = precond::KFAC<float, Mem>;
  const Space space;
  precond::KFACOptions k;
  k.factor_update_steps = 2;
  k.inv_update_steps = 2;
  k.damping = 0.01;
  Model ref = toy_model(), model = toy_model();
  KFAC ref_kfac(k);
  auto kfac = std::make_shared<KFAC>(k);
  REQUIRE(ref_kfac.register_model(ref) == 2);
  REQUIRE(kfac->register_model(model) == 2);
  train::KFACTransform<KFAC> transform(kfac);
  nn::SoftmaxCrossEntropy<float, Mem> ce;
  Vector<float, Mem> copy("copy", model.parameter_count());
  for (std::uint64_t step = 0; step < 3; ++step) {
    const auto x = random_matrix<float>(5, 6, 100 + step);
    Vector<std::int32_t, Mem> y("y", 5);
    Kokkos::deep_copy(y, std::int32_t(step % 3));
    for (Model *m : {&ref, &model}) {
      const auto &logits = m->forward(space, x);
      Matrix<float, Mem> dlogits("dlogits", 5, 3);
      ce.forward_backward(space, logits, y, dlogits);
      m->backward(space, dlogits, Model::Gradients::overwrite);
    }
    const auto before = to_host(model.gradients());
    Kokkos::deep_copy(space, copy, model.gradients());
    ref_kfac.step(space);
    transform.transform(space, model.parameters(), copy);
    const auto got = to_host(copy), want = to_host(ref.gradients()),
               untouched = to_host(model.gradients());
    bool preconditioned = false;
    for (std::size_t i = 0; i < got.extent(0); ++i) {
      REQUIRE(got(i) == want(i));
      REQUIRE(untouched(i) == before(i));
      preconditioned = preconditioned || got(i) != before(i);
    }
    CHECK(preconditioned);
    CHECK(kfac->kl_scale() == ref_kfac.kl_scale());
    Kokkos::deep_copy(space, model.gradients(), copy); // the models stay identical
  }
  // A gradient vector of another length, and a KFAC whose layer is not in a model's buffer.
  Vector<float, Mem> shorter("shorter", model.parameter_count() - 1);
  CHECK_THROWS_MATCHES(transform.transform(space, model.parameters(), shorter), ShapeError,
                       MessageContains("grads length"));
  auto raw = std::make_shared<KFAC>(k);
  Model other = toy_model();
  const auto &dense = *other.layers()[1];
  REQUIRE(raw->register_layer("dense", [&dense] { return dense.curvature(); }));
  train::KFACTransform<KFAC> raw_transform(raw);
  CHECK_THROWS_MATCHES(raw_transform.transform(space, other.parameters(), other.gradients()),
                       ValueError, MessageContains("layer 'dense' is not in the gradient buffer"));
}

TEST_CASE("trainer: K-FAC's and the schedules' registry options", "[train][registry]") {
  train::Config c;
  for (const auto &o : train::kfac_option_specs()) {
    if (!o.default_value.empty()) {
      c.set(o.name, o.default_value);
    }
  }
  const precond::KFACOptions k = train::kfac_options(c, 0.5);
  CHECK(k.factor_update_steps.value() == 10);
  CHECK(k.inv_update_steps.value() == 100);
  CHECK(k.damping.value() == 0.01);
  CHECK(k.kl_clip.value() == 1e-4);
  CHECK(k.compute_method == precond::ComputeMethod::inverse);
  CHECK(k.skip_layers.empty());
  CHECK(k.lr(1000) == 0.5);
  c.set("compute-method", "cholesky");
  CHECK_THROWS_MATCHES(
      train::kfac_options(c, 0.5), ValueError,
      MessageContains("--compute-method must be eigen or inverse, got 'cholesky'"));
  // The numeric options carry their ranges, which kfac_options checks too.
  c.set("compute-method", "eigen");
  const std::vector<std::array<std::string, 3>> refused = {
      {"damping", "0", "must be a number > 0, got '0'"},
      {"factor-decay", "1", "must be a number in [0, 1), got '1'"},
      {"kl-clip", "-1e-4", "must be a number >= 0, got '-1e-4'"},
      {"factor-update-steps", "0", "must be an integer >= 1, got '0'"},
      {"inv-update-steps", "-100", "must be an integer >= 1, got '-100'"}};
  for (const auto &[name, value, message] : refused) {
    train::Config d = c;
    d.set(name, value);
    CHECK_THROWS_MATCHES(train::kfac_options(d, 0.5), ValueError,
                         MessageContains("option --" + name + " " + message));
  }

  const auto schedules = train::lr_schedules();
  CHECK(schedules.names() == std::vector<std::string>{"constant", "cosine", "step"});
  train::Config s;
  s.set("step-size", "3");
  s.set("gamma", "0.5");
  const auto step = schedules.at("step").make(s, 0.1, 100);
  CHECK(step(2) == 0.1);
  CHECK(step(3) == 0.05);
  CHECK(schedules.at("cosine").make(s, 0.1, 100)(100) == Approx(0.0).margin(1e-15));
  CHECK(schedules.at("constant").make(s, 0.1, 100).is_constant());
}

#ifdef KAT_ENABLE_MPI

TEST_CASE("trainer: MPIProcessGroup's sums and minima and gathers", "[mpi][train]") {
  auto comm = distributed::Communicator::world();
  INFO(rank_of(comm));
  const distributed::MPIProcessGroup group(comm);
  const int p = group.size(), r = group.rank();
  CHECK(p == comm.size());
  std::vector<double> v{double(r + 1), 2.0};
  group.sum(v);
  CHECK(v == std::vector<double>{p * (p + 1) / 2.0, 2.0 * p});
  CHECK(group.min(10 - r) == 10 - (p - 1));
  const auto all = group.gather({double(r), double(r * r)});
  REQUIRE(all.size() == std::size_t(p));
  for (int q = 0; q < p; ++q) {
    CHECK(all[std::size_t(q)] == std::vector<double>{double(q), double(q * q)});
  }
  group.barrier();
}

TEST_CASE("trainer: data parallel over the ranks equals one process on the global batch",
          "[mpi][train]") {
  using DModel = nn::Sequential<double, Mem>;
  auto comm = distributed::Communicator::world();
  INFO(rank_of(comm));
  const Space space;
  const auto data = toy_data(144);
  const std::size_t global = 24, local = global / std::size_t(comm.size()); // 6 steps an epoch
  optim::SGD<double, Mem>::Options o;
  o.lr = 0.1;
  o.momentum = 0.9;
  struct Result {
    std::vector<double> params;
    double train_loss = 0;
  };
  struct Keep : train::Callback<double, Mem> {
    double loss = 0;
    std::string name() const override { return "keep"; }
    void on_epoch_end(train::Trainer<double, Mem> &, train::EpochSummary &s) override {
      loss = s.train_loss;
    }
  };
  const auto run = [&](bool parallel) {
    DModel model = toy_model<double>();
    optim::SGD<double, Mem> opt(model.parameter_count(), o);
    data::DataLoader<double, Mem> loader(data, parallel ? local : global, true, 9);
    train::Trainer<double, Mem> trainer(model, opt, loader);
    auto keep = std::make_shared<Keep>();
    trainer.add_callback(keep);
    auto group = std::make_shared<distributed::MPIProcessGroup>(comm);
    const distributed::DistributedSampler sampler(data.size(), comm.rank(), comm.size(), 9);
    if (parallel) {
      trainer.set_process_group(group);
      trainer.set_gradient_sync(
          std::make_shared<distributed::DataParallel<double, Mem>>(comm, model));
      trainer.set_epoch_order([&sampler](std::size_t e) { return sampler.indices(e); });
    }
    trainer.fit(space, 2);
    const auto h = to_host(model.parameters());
    return Result{std::vector<double>(h.data(), h.data() + h.extent(0)), keep->loss};
  };
  const Result one = run(false), many = run(true);
  REQUIRE(one.params.size() == many.params.size());
  for (std::size_t i = 0; i < one.params.size(); ++i) {
    CHECK(many.params[i] == Approx(one.params[i]).epsilon(1e-12).margin(1e-14));
  }
  CHECK(many.train_loss == Approx(one.train_loss).epsilon(1e-12));
}

#endif

} // namespace test_trainer
