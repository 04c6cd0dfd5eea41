// kat_train's registries of components and optimizers, and the flags they declare.
#include "run.hpp"

#include <algorithm>
#include <map>
#include <utility>

namespace kat_train {
namespace {

template <class T> struct Ordered {
  int order;
  T item;
};

// Function-local statics: the registrations run during static initialization, in any order.
std::vector<Ordered<std::function<std::unique_ptr<Component>()>>> &component_list() {
  static std::vector<Ordered<std::function<std::unique_ptr<Component>()>>> list;
  return list;
}

struct OptimizerEntry {
  std::string name, help;
  std::vector<Opt> options;
  std::function<void(Setup &)> make;
};
std::vector<Ordered<OptimizerEntry>> &optimizer_list() {
  static std::vector<Ordered<OptimizerEntry>> list;
  return list;
}

} // namespace

ComponentRegistration::ComponentRegistration(int order,
                                             std::function<std::unique_ptr<Component>()> make) {
  component_list().push_back({order, std::move(make)});
}

Run::Run(int argc_, char **argv_) : argc(argc_), argv(argv_) {
  auto list = component_list();
  std::stable_sort(list.begin(), list.end(),
                   [](const auto &a, const auto &b) { return a.order < b.order; });
  for (const auto &c : list) {
    parts.push_back(c.item());
  }
}

Run::~Run() { release(); }

void Run::release() {
  trainer.reset(); // first: it holds the callbacks, the syncs and the transforms
  setup.reset();
  train_loader.reset();
  test_loader.reset();
  model.reset();
  make_model = nullptr;
  configure = nullptr;
  train_group.reset();
  parts.clear();
}

OptimizerRegistration::OptimizerRegistration(int order, std::string name, std::string help,
                                             std::vector<Opt> options,
                                             std::function<void(Setup &)> make) {
  optimizer_list().push_back(
      {order, {std::move(name), std::move(help), std::move(options), std::move(make)}});
}

Optimizers &optimizers() {
  static Optimizers registry = [] {
    auto list = optimizer_list();
    std::stable_sort(list.begin(), list.end(),
                     [](const auto &a, const auto &b) { return a.order < b.order; });
    Optimizers r("optimizer");
    for (auto &e : list) {
      r.add(e.item.name, e.item.help, e.item.options, e.item.make);
    }
    return r;
  }();
  return registry;
}

const Flag *Run::find_flag(const std::string &name) const {
  const auto f =
      std::find_if(flags.begin(), flags.end(), [&name](const Flag &g) { return g.name == name; });
  return f == flags.end() ? nullptr : &*f;
}

const Flag &Run::flag(const std::string &name) const {
  if (const Flag *f = find_flag(name)) {
    return *f;
  }
  throw kat::ValueError("kat_train: no component declares the option --" + name);
}

void Run::add_options(const std::string &owner, const std::string &title, const std::string &help,
                      const std::vector<Opt> &options) {
  auto *group = app.add_option_group(title, help);
  for (const auto &o : options) {
    if (find_flag(o.name) != nullptr) {
      continue; // declared before: its choices were merged by the caller (add_registry)
    }
    flags.push_back({o.name, o.default_value, nullptr, owner});
    std::string &value = flags.back().value;
    if (o.is_flag) {
      flags.back().option = group->add_flag_callback(
          "--" + o.name, [&value] { value = "true"; }, o.help);
      continue;
    }
    auto *opt = group->add_option("--" + o.name, value,
                                  o.range ? o.help + " (" + o.range->describe() + ")" : o.help);
    flags.back().option = opt;
    if (!o.choices.empty()) {
      opt->check(CLI::IsMember(o.choices));
    }
    if (o.range) { // refused at parsing (a usage error naming the flag), before anything is built
      opt->check(CLI::Validator(
          [spec = o](std::string &text) { return kat::train::option_value_error(spec, text); },
          ""));
    }
    if (!o.default_value.empty()) {
      opt->capture_default_str();
    }
  }
}

Model Run::new_model(const Space &space) const {
  Model m = make_model();
  m.compile(space, seed);
  if (configure) {
    configure(m);
  }
  return m;
}

} // namespace kat_train
