#pragma once
/// @file
/// @brief Umbrella header: everything KAT offers.

// KAT_VERSION, KAT_VERSION_STRING and KAT_VERSION_MAJOR/MINOR/PATCH come from kat/version.hpp,
// which CMake generates into the build tree (cmake/version.hpp.in) and installs beside these
// headers; KAT::kat and the pkg-config file put it on the include path. A program that
// includes KAT straight from a source checkout, without CMake, has no kat/version.hpp: it gets
// every header below but no KAT_VERSION macros (test with #ifdef KAT_VERSION). The first
// kat/version.hpp on the include path is the one used, so an older installed KAT ahead of a
// source checkout would give that version's numbers.
#if __has_include("kat/version.hpp")
#include "kat/version.hpp"
#endif

#include "kat/core/allocation_tracker.hpp"
#include "kat/core/bfloat16.hpp"
#include "kat/core/blas.hpp"
#include "kat/core/curvature.hpp"
#include "kat/core/denormals.hpp"
#include "kat/core/error.hpp"
#include "kat/core/hyperparameter.hpp"
#include "kat/core/lanczos.hpp"
#include "kat/core/linalg.hpp"
#include "kat/core/math.hpp"
#include "kat/core/parameter_buffer.hpp"
#include "kat/core/policy.hpp"
#include "kat/core/profiling.hpp"
#include "kat/core/random.hpp"
#include "kat/core/region_timer.hpp"
#include "kat/core/state.hpp"
#include "kat/core/tridiagonal.hpp"
#include "kat/core/views.hpp"
#include "kat/core/workspace.hpp"

#include "kat/nn/activation.hpp"
#include "kat/nn/attention.hpp"
#include "kat/nn/avg_pool2d.hpp"
#include "kat/nn/batch_norm.hpp"
#include "kat/nn/conv2d.hpp"
#include "kat/nn/dense.hpp"
#include "kat/nn/dropout.hpp"
#include "kat/nn/embedding.hpp"
#include "kat/nn/flatten.hpp"
#include "kat/nn/gelu.hpp"
#include "kat/nn/global_avg_pool2d.hpp"
#include "kat/nn/hessian_vector_product.hpp"
#include "kat/nn/init.hpp"
#include "kat/nn/layer.hpp"
#include "kat/nn/layer_norm.hpp"
#include "kat/nn/max_pool2d.hpp"
#include "kat/nn/metrics.hpp"
#include "kat/nn/models.hpp"
#include "kat/nn/mse_loss.hpp"
#include "kat/nn/position_embedding.hpp"
#include "kat/nn/residual.hpp"
#include "kat/nn/sequential.hpp"
#include "kat/nn/softmax_cross_entropy.hpp"
#include "kat/nn/transformer.hpp"

#include "kat/optim/adam.hpp"
#include "kat/optim/fosi.hpp"
#include "kat/optim/fosi_partition.hpp"
#include "kat/optim/lr_schedule.hpp"
#include "kat/optim/optimizer.hpp"
#include "kat/optim/sgd.hpp"
#include "kat/precond/kfac.hpp"
#include "kat/precond/kronecker_factor.hpp"

#include "kat/core/csr_weight.hpp"

#include "kat/data/data_loader.hpp"
#include "kat/data/dataset.hpp"
#include "kat/data/idx.hpp"

#include "kat/io/checkpoint.hpp"

// Tensor-parallel planning (host only). kat/plan/plan_io.hpp, plans as JSON, needs
// nlohmann/json and is not included here.
#include "kat/plan/cost_model.hpp"
#include "kat/plan/folding.hpp"
#include "kat/plan/gpt.hpp"
#include "kat/plan/graph.hpp"
#include "kat/plan/megatron.hpp"
#include "kat/plan/plan.hpp"
#include "kat/plan/search.hpp"
#include "kat/plan/strategy.hpp"

#include "kat/train/callback.hpp"
#include "kat/train/checkpointer.hpp"
#include "kat/train/console_logger.hpp"
#include "kat/train/fosi_report.hpp"
#include "kat/train/gradient_sync.hpp"
#include "kat/train/gradient_transform.hpp"
#include "kat/train/kfac_transform.hpp"
#include "kat/train/lr_schedules.hpp"
#include "kat/train/metrics_writer.hpp"
#include "kat/train/process_group.hpp"
#include "kat/train/profiler.hpp"
#include "kat/train/registry.hpp"
#include "kat/train/trainer.hpp"

#include "kat/sparse/agent.hpp"
#include "kat/sparse/agent_probe.hpp"
#include "kat/sparse/density.hpp"
#include "kat/sparse/mask.hpp"
#include "kat/sparse/options.hpp"
#include "kat/sparse/sparse_training.hpp"

// DistributedSampler, ParameterShard, DASOSchedule and EmulatedLink need no MPI; the rest of
// kat::distributed does (KAT configured with -DKAT_ENABLE_MPI=ON).
#include "kat/distributed/comm/emulated_link.hpp"
#include "kat/distributed/data_parallel/daso_schedule.hpp"
#include "kat/distributed/data_parallel/distributed_sampler.hpp"
#include "kat/distributed/fosi/parameter_shard.hpp"
#ifdef KAT_ENABLE_MPI
#include "kat/distributed/comm/communicator.hpp"
#include "kat/distributed/comm/mpi_environment.hpp"
#include "kat/distributed/comm/process_group.hpp"
#include "kat/distributed/comm/thread_budget.hpp"
#include "kat/distributed/data_parallel/daso.hpp"
#include "kat/distributed/data_parallel/data_parallel.hpp"
#include "kat/distributed/fosi/dho2.hpp"
#include "kat/distributed/fosi/dho2_overlap.hpp"
#include "kat/distributed/fosi/sharded_lanczos.hpp"
#include "kat/distributed/fosi/sharded_operator.hpp"
#include "kat/distributed/kfac/dkfac.hpp"
#include "kat/distributed/kfac/dpkfac.hpp"
#include "kat/distributed/kfac/kaisa.hpp"
#include "kat/distributed/kfac/kfac_strategies.hpp"
#include "kat/distributed/tensor_parallel/tensor_parallel_dense.hpp"
#include "kat/distributed/tensor_parallel/tensor_parallel_model.hpp"
#endif
