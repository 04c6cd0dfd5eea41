// Data-parallel training of the Fashion-MNIST MLP with kat::distributed::DataParallel:
//
//   mpiexec -n 2 examples/kat_data_parallel --epochs 1 --batch 128
//
// Every rank loads the whole data set and trains on its shard (DistributedSampler). The
// global batch of --batch samples is split into --batch / P samples per rank, and gradients
// are averaged by bucketed all-reduces that overlap backward. Rank 0 prints the metrics summed
// over ranks and the exposed communication time.
#include <kat/kat.hpp>

#include <CLI/CLI.hpp>
#include <mpi.h>

#include <chrono>
#include <cstdio>
#include <exception>
#include <string>

namespace {

using Scalar = float;
using Mem = kat::DefaultMemorySpace;
using Space = Mem::execution_space;

int run(int argc, char **argv) {
  CLI::App app{"KAT data-parallel MLP on Fashion-MNIST"};
  std::size_t epochs = 1;
  std::size_t global_batch = 128;
  double lr = 0.05;
  std::size_t bucket_kib = 1024;
  std::uint64_t seed = 1;
  std::string data_dir = kat::data::default_fashion_mnist_dir;
  app.add_option("--epochs", epochs, "epochs")->check(CLI::PositiveNumber);
  app.add_option("--batch", global_batch, "global batch size (divisible by the rank count)")
      ->check(CLI::PositiveNumber);
  app.add_option("--lr", lr, "SGD learning rate (momentum 0.9)");
  app.add_option("--bucket-kib", bucket_kib, "all-reduce bucket size in KiB")
      ->check(CLI::PositiveNumber);
  app.add_option("--seed", seed, "seed of the initialization and the shuffles");
  app.add_option("--data-dir", data_dir, "directory with the Fashion-MNIST IDX files");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError &e) {
    return app.exit(e);
  }

  auto comm = kat::distributed::Communicator::world();
  const int p = comm.size();
  const bool root = comm.rank() == 0;
  if (global_batch % std::size_t(p) != 0) {
    if (root) {
      std::fprintf(stderr, "--batch %zu is not divisible by the %d ranks\n", global_batch, p);
    }
    return 2;
  }
  const std::size_t local_batch = global_batch / std::size_t(p);

  const auto train = kat::data::load_fashion_mnist(data_dir, kat::data::Split::train);
  const auto test = kat::data::load_fashion_mnist(data_dir, kat::data::Split::test);
  kat::data::DataLoader<Scalar, Mem> train_loader(train, local_batch, false, seed);
  kat::data::DataLoader<Scalar, Mem> test_loader(test, 1000, false, seed);
  const kat::distributed::DistributedSampler train_sampler(train.size(), comm.rank(), p, seed);
  const kat::distributed::DistributedSampler test_sampler(test.size(), comm.rank(), p, seed, false);

  const Space space;
  auto model = kat::nn::models::mlp<Scalar, Mem>(train.shape, train.classes);
  model.compile(space, seed);
  kat::distributed::DataParallelOptions options;
  options.bucket_bytes = bucket_kib * 1024;
  kat::distributed::DataParallel<Scalar, Mem> dp(comm, model, options);
  dp.broadcast_parameters(space);
  model.set_backward_hook(dp.backward_hook(space));

  kat::optim::SGD<Scalar, Mem>::Options sgd;
  sgd.lr = lr;
  sgd.momentum = 0.9;
  kat::optim::SGD<Scalar, Mem> optimizer(model.parameter_count(), sgd);
  kat::nn::SoftmaxCrossEntropy<Scalar, Mem> loss;
  kat::Matrix<Scalar, Mem> dlogits("dlogits", local_batch, train.classes);

  if (root) {
    std::printf("%d ranks, global batch %zu (%zu per rank), %zu parameters in %zu buckets\n", p,
                global_batch, local_batch, model.parameter_count(), dp.buckets().size());
  }
  kat::data::DataLoader<Scalar, Mem>::matrix_type x;
  kat::data::DataLoader<Scalar, Mem>::label_vector y;
  for (std::size_t epoch = 0; epoch < epochs; ++epoch) {
    comm.barrier();
    const auto t0 = std::chrono::steady_clock::now();
    dp.reset_stats();
    model.train();
    kat::distributed::Metrics local;
    train_loader.start_epoch(epoch, train_sampler.indices(epoch));
    while (train_loader.next(space, x, y)) {
      const std::size_t b = x.extent(0);
      kat::Matrix<Scalar, Mem> grad(dlogits.data(), b, dlogits.extent(1));
      const auto &logits = model.forward(space, x);
      local.loss_sum += loss.forward_backward(space, logits, y, grad) * double(b);
      local.correct += std::int64_t(
          kat::nn::count_correct(space, logits, kat::Vector<const std::int32_t, Mem>(y)));
      local.samples += std::int64_t(b);
      model.backward(space, grad, kat::nn::Sequential<Scalar, Mem>::Gradients::overwrite);
      dp.finish(space);
      optimizer.step(space, model.parameters(), model.gradients());
    }
    space.fence();
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const auto stats = dp.stats();
    const auto train_totals = dp.reduce_metrics(local);

    model.eval();
    kat::distributed::Metrics eval;
    test_loader.start_epoch(0, test_sampler.indices(0));
    while (test_loader.next(space, x, y)) {
      const auto &logits = model.forward(space, x);
      eval.loss_sum += loss.forward(space, logits, y) * double(x.extent(0));
      eval.correct += std::int64_t(
          kat::nn::count_correct(space, logits, kat::Vector<const std::int32_t, Mem>(y)));
      eval.samples += std::int64_t(x.extent(0));
    }
    const auto test_totals = dp.reduce_metrics(eval);
    if (root) {
      std::printf("epoch %zu: train loss %.4f acc %.4f | test loss %.4f acc %.4f (%lld samples)"
                  " | %.2f s, exposed communication %.3f s (%.1f%%) over %llu steps, "
                  "%.1f MiB all-reduced per rank\n",
                  epoch, train_totals.mean_loss(), train_totals.accuracy(), test_totals.mean_loss(),
                  test_totals.accuracy(), static_cast<long long>(test_totals.samples), seconds,
                  stats.exposed_seconds, 100.0 * stats.exposed_seconds / seconds,
                  static_cast<unsigned long long>(stats.steps),
                  double(stats.allreduce.bytes) / (1024.0 * 1024.0));
    }
  }
  model.clear_backward_hook();
  return 0;
}

} // namespace

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  int result = 0;
  {
    Kokkos::ScopeGuard kokkos(argc, argv);
    try {
      result = run(argc, argv);
    } catch (const std::exception &e) {
      int rank = 0;
      MPI_Comm_rank(MPI_COMM_WORLD, &rank);
      std::fprintf(stderr, "rank %d: %s\n", rank, e.what());
      MPI_Abort(MPI_COMM_WORLD, 1);
    }
  }
  MPI_Finalize();
  return result;
}
