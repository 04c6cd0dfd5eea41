// Measures this machine's MPI alpha (latency, s) and beta (s per byte) for kat::plan's
// alpha-beta cost model (include/kat/plan/cost_model.hpp): times MPI_Allreduce on float buffers
// of 8 B to 8 MiB (--max-bytes; beyond it Open MPI's shared-memory transport on the 2-core VM
// swings by 10x between runs), fits t = alpha + beta·2(p−1)/p·bytes (alpha: the median time of
// the messages up to 512 B; beta: the median slope of those of 32 KiB and more, so one slow
// size does not move the fit), and checks the fit against MPI_Allgather and
// MPI_Reduce_scatter_block (model: alpha + beta·(p−1)/p·bytes, bytes = the whole tensor).
//
//   mpirun --allow-run-as-root --oversubscribe -np 2 kat_mpi_alpha_beta [--max-bytes N]
//
// scripts/measure_alpha_beta.sh builds and runs it. Each size's time is the median over
// repetitions of the slowest rank's time, with a barrier before each repetition.
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

namespace {

// Median over repetitions of max over ranks of one call's time; repeats until `budget`
// seconds or `max_reps` calls (at least 5).
double time_call(const std::function<void()> &call, double budget, int max_reps) {
  for (int w = 0; w < 3; ++w) {
    call(); // warm-up: buffers, connections
  }
  std::vector<double> times;
  double spent = 0;
  for (int r = 0; r < max_reps && (r < 5 || spent < budget); ++r) {
    MPI_Barrier(MPI_COMM_WORLD);
    const double t0 = MPI_Wtime();
    call();
    double local = MPI_Wtime() - t0, slowest = 0;
    MPI_Allreduce(&local, &slowest, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    times.push_back(slowest);
    spent += slowest;
    // every rank must agree on whether to go on
    MPI_Bcast(&spent, 1, MPI_DOUBLE, 0, MPI_COMM_WORLD);
  }
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

} // namespace

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, ranks = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &ranks);
  std::size_t max_bytes = std::size_t(8) << 20;
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::strcmp(argv[i], "--max-bytes") == 0) {
      max_bytes = std::strtoull(argv[i + 1], nullptr, 10);
    }
  }
  if (ranks < 2) {
    if (rank == 0) {
      std::fprintf(stderr, "kat_mpi_alpha_beta: needs >= 2 ranks (mpirun -np 2 ...)\n");
    }
    MPI_Finalize();
    return 2;
  }
  // Sizes divisible by 4·ranks so reduce-scatter blocks are whole floats.
  std::vector<std::size_t> sizes;
  for (std::size_t b = 8; b <= max_bytes; b *= 4) {
    const std::size_t unit = 4 * static_cast<std::size_t>(ranks);
    sizes.push_back(std::max(unit, (b + unit - 1) / unit * unit));
  }
  const double p = ranks;
  struct Row {
    std::size_t bytes;
    double allreduce, allgather, reduce_scatter;
  };
  std::vector<Row> rows;
  std::vector<float> send(max_bytes / 4 + 4 * ranks, 1.0f), recv(send.size(), 0.0f);
  for (const std::size_t bytes : sizes) {
    const int n = static_cast<int>(bytes / 4);
    const int block = n / ranks;
    Row row{bytes, 0, 0, 0};
    row.allreduce = time_call(
        [&] { MPI_Allreduce(send.data(), recv.data(), n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD); },
        0.3, 2000);
    row.allgather = time_call(
        [&] {
          MPI_Allgather(send.data(), block, MPI_FLOAT, recv.data(), block, MPI_FLOAT,
                        MPI_COMM_WORLD);
        },
        0.3, 2000);
    row.reduce_scatter = time_call(
        [&] {
          MPI_Reduce_scatter_block(send.data(), recv.data(), block, MPI_FLOAT, MPI_SUM,
                                   MPI_COMM_WORLD);
        },
        0.3, 2000);
    rows.push_back(row);
  }
  // Robust to the shared machine's outliers (single sizes 10x slow in some runs): alpha is the
  // median all-reduce time of the messages up to 512 bytes, beta the median over messages of
  // 32 KiB and more of (t - alpha) / (2(p-1)/p · bytes).
  const auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v.empty() ? 0.0 : v[v.size() / 2];
  };
  std::vector<double> small, slopes;
  for (const auto &r : rows) {
    if (r.bytes <= 512) {
      small.push_back(r.allreduce);
    }
  }
  const double alpha = median(small);
  for (const auto &r : rows) {
    if (r.bytes >= 32768) {
      slopes.push_back((r.allreduce - alpha) /
                       (2.0 * (p - 1.0) / p * static_cast<double>(r.bytes)));
    }
  }
  const double beta = median(slopes);
  if (rank == 0) {
    std::printf("# kat_mpi_alpha_beta: %d ranks; times are medians of the slowest rank (us)\n",
                ranks);
    std::printf("# fit of MPI_Allreduce: t = alpha + beta * 2(p-1)/p * bytes (medians)\n");
    std::printf("%12s %12s %12s %12s %12s %12s %12s\n", "bytes", "allreduce", "model", "allgather",
                "model", "red_scatter", "model");
    for (const auto &r : rows) {
      const double b = static_cast<double>(r.bytes);
      const double ar_model = alpha + beta * 2.0 * (p - 1.0) / p * b;
      const double ag_model = alpha + beta * (p - 1.0) / p * b;
      std::printf("%12zu %12.2f %12.2f %12.2f %12.2f %12.2f %12.2f\n", r.bytes, r.allreduce * 1e6,
                  ar_model * 1e6, r.allgather * 1e6, ag_model * 1e6, r.reduce_scatter * 1e6,
                  ag_model * 1e6);
    }
    std::printf("alpha_s %.6g\nbeta_s_per_byte %.6g\nbandwidth_GB_per_s %.4g\n", alpha, beta,
                1e-9 / beta);
  }
  MPI_Finalize();
  return 0;
}
