#pragma once
// The plain optimizers' construction and options, which K-FAC and FOSI build on
// (examples/train/optimizers.cpp).
#include "run.hpp"

#include <vector>

namespace kat_train {

/// --lr, --momentum, --nesterov, --weight-decay.
std::vector<Opt> sgd_options();
/// --lr, --weight-decay.
std::vector<Opt> adam_options();
/// SGD (or Nesterov SGD) for s.parameters, and the schedule from its base rate.
void make_sgd(Setup &s, bool nesterov = false);
/// Adam with PyTorch's defaults (weight decay 0), and the schedule from its base rate.
void make_adam(Setup &s);

} // namespace kat_train
