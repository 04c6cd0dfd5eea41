#pragma once
/// @file
/// @brief Umbrella header: everything KAT offers.

#include "kat/core/allocation_tracker.hpp"
#include "kat/core/blas.hpp"
#include "kat/core/curvature.hpp"
#include "kat/core/error.hpp"
#include "kat/core/hyperparameter.hpp"
#include "kat/core/linalg.hpp"
#include "kat/core/math.hpp"
#include "kat/core/parameter_buffer.hpp"
#include "kat/core/policy.hpp"
#include "kat/core/profiling.hpp"
#include "kat/core/random.hpp"
#include "kat/core/region_timer.hpp"
#include "kat/core/state.hpp"
#include "kat/core/views.hpp"
#include "kat/core/workspace.hpp"

#include "kat/nn/activation.hpp"
#include "kat/nn/avg_pool2d.hpp"
#include "kat/nn/batch_norm.hpp"
#include "kat/nn/conv2d.hpp"
#include "kat/nn/dense.hpp"
#include "kat/nn/dropout.hpp"
#include "kat/nn/flatten.hpp"
#include "kat/nn/global_avg_pool2d.hpp"
#include "kat/nn/init.hpp"
#include "kat/nn/layer.hpp"
#include "kat/nn/max_pool2d.hpp"
#include "kat/nn/metrics.hpp"
#include "kat/nn/models.hpp"
#include "kat/nn/mse_loss.hpp"
#include "kat/nn/residual.hpp"
#include "kat/nn/sequential.hpp"
#include "kat/nn/softmax_cross_entropy.hpp"

#include "kat/optim/adam.hpp"
#include "kat/optim/lr_schedule.hpp"
#include "kat/optim/optimizer.hpp"
#include "kat/optim/sgd.hpp"
#include "kat/precond/kfac.hpp"
#include "kat/precond/kronecker_factor.hpp"

#include "kat/data/data_loader.hpp"
#include "kat/data/dataset.hpp"
#include "kat/data/idx.hpp"

#include "kat/io/checkpoint.hpp"

// DistributedSampler needs no MPI; the rest of kat::distributed does (KAT configured with
// -DKAT_ENABLE_MPI=ON).
#include "kat/distributed/distributed_sampler.hpp"
#ifdef KAT_ENABLE_MPI
#include "kat/distributed/communicator.hpp"
#include "kat/distributed/data_parallel.hpp"
#include "kat/distributed/dkfac.hpp"
#include "kat/distributed/dpkfac.hpp"
#include "kat/distributed/kaisa.hpp"
#include "kat/distributed/thread_budget.hpp"
#endif
