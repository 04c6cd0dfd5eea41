// --optimizer kfac: K-FAC preconditioning (kat::precond::KFAC, as a gradient transform) + SGD,
// with, on several ranks, a distributed K-FAC strategy (docs/kfac.md, docs/distributed.md).
#include "optimizers.hpp"

#include <kat/precond/kfac.hpp>
#include <kat/train/kfac_transform.hpp>
#ifdef KAT_ENABLE_MPI
#include <kat/distributed/kfac/dkfac.hpp>
#include <kat/distributed/kfac/kfac_strategies.hpp>
#endif

#include <memory>

namespace kat_train {
namespace {

// K-FAC in the precisions chosen, with the distributed strategy chosen, as a transform.
template <class InverseScalar, class FactorScalar> void add_kfac(Setup &s) {
  using KFAC = kat::precond::KFAC<Scalar, Mem, InverseScalar, FactorScalar>;
  auto kfac = std::make_shared<KFAC>(kat::train::kfac_options(s.config, s.lr));
  kfac->register_model(s.model);
  std::shared_ptr<kat::precond::KFACStrategy<KFAC>> strategy;
#ifdef KAT_ENABLE_MPI
  if (daso(s.config)) {
    // DASO averages gradients inside a node: K-FAC averages its factors there too (D-KFAC on
    // the node's ranks), so a node's replicas take the same preconditioned step.
    strategy = std::make_shared<kat::distributed::DKFAC<KFAC>>(*s.node_comm, *kfac);
  } else if (s.config.has("dist-strategy")) {
    strategy = kat::distributed::kfac_strategies<KFAC>()
                   .at(s.config.text("dist-strategy"))
                   .make(*s.comm, *kfac, s.config);
  }
#endif
  if (s.group.size() > 1 && !strategy) {
    throw kat::ValueError(kat::detail::concat("--optimizer kfac on ", s.group.size(),
                                              " ranks needs --dist-strategy"));
  }
  s.transforms.push_back(std::make_shared<kat::train::KFACTransform<KFAC>>(kfac, strategy));
}

void make_kfac(Setup &s) {
  make_sgd(s);
  const bool inverse_double = s.config.text("inverse-precision") == "double";
  const bool factor_double = s.config.text("factor-precision") == "double";
  inverse_double ? (factor_double ? add_kfac<double, double>(s) : add_kfac<double, float>(s))
                 : (factor_double ? add_kfac<float, double>(s) : add_kfac<float, float>(s));
}

std::vector<Opt> kfac_options() {
  std::vector<Opt> kfac = sgd_options();
  for (const auto &o : kat::train::kfac_option_specs()) {
    kfac.push_back(o);
  }
#ifdef KAT_ENABLE_MPI
  const auto strategies = kat::distributed::kfac_strategies<kat::precond::KFAC<Scalar, Mem>>();
  auto choices = strategies.names();
  choices.push_back("daso");
  kfac.push_back({"dist-strategy",
                  "Distributed strategy on several ranks: K-FAC's for kfac, dho2 for fosi-*, "
                  "daso for any (K-FAC then averages its factors inside each node)",
                  "", choices});
  for (const auto &e : strategies.entries()) {
    kfac.insert(kfac.end(), e.options.begin(), e.options.end());
  }
#endif
  return kfac;
}

const OptimizerRegistration kfac(40, "kfac", "K-FAC preconditioning + SGD (docs/kfac.md)",
                                 kfac_options(), make_kfac);

} // namespace
} // namespace kat_train
