// Tensor-parallel execution (Megatron-style column-/row-parallel Dense, heads-split attention, the
// D x T mesh): the sharded forward and backward equal the single-rank model's, and the bytes the
// layers hand to MPI are the activation sizes the Megatron schedule predicts.
#include "test_helpers.hpp"

#include <catch2/catch.hpp>

#ifdef KAT_ENABLE_MPI
#include "mpi_test_helpers.hpp"

#include <kat/distributed/tensor_parallel/tensor_parallel_model.hpp>
#include <kat/nn/gelu.hpp>
#include <kat/nn/layer_norm.hpp>
#include <kat/nn/models.hpp>
#include <kat/nn/sequential.hpp>
#include <kat/plan/megatron.hpp>
#include <kat/plan/search.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

namespace test_tensor_parallel {

using namespace kat;
using namespace kat::test;
using Model = nn::Sequential<double, Mem>;
using dist::ColumnParallelDense;
using dist::Communicator;
using dist::RowParallelDense;
using dist::TensorParallelMesh;

template <class View> std::vector<double> host_vector(const View &v) {
  auto h = to_host(v);
  return std::vector<double>(h.data(), h.data() + h.span());
}

double max_abs_diff(const std::vector<double> &a, const std::vector<double> &b) {
  REQUIRE(a.size() == b.size());
  double d = 0;
  for (std::size_t k = 0; k < a.size(); ++k)
    d = std::max(d, std::abs(a[k] - b[k]));
  return d;
}

// Rows [first, first + count) of m.
Matrix<double, Mem> rows_of(const Matrix<double, Mem> &m, std::size_t first, std::size_t count) {
  Matrix<double, Mem> out("rows", count, m.extent(1));
  Kokkos::deep_copy(out, Kokkos::subview(m, std::make_pair(first, first + count), Kokkos::ALL));
  return out;
}

// The tensor-parallel degrees T that divide both the world size and `split`, the size a model
// splits over its T ranks (heads, a hidden width).
std::vector<int> degrees(int world, std::size_t split) {
  std::vector<int> t;
  for (int k = 1; k <= world; ++k)
    if (world % k == 0 && split % std::size_t(k) == 0)
      t.push_back(k);
  return t;
}

// Runs `whole` on the whole batch (x, dy) and `split` on data-parallel shard d of D (rows
// [d N/D, (d+1) N/D)), sums the split gradients over the mesh's data group, and checks the
// outputs and this rank's gradient shard against the whole model's. `split` must hold this
// rank's shard of `whole`'s parameters (dist::copy_sharded_parameters).
void check_sharded_step(TensorParallelMesh &mesh, Model &whole, Model &split,
                        const Matrix<double, Mem> &x, const Matrix<double, Mem> &dy) {
  const Space space;
  const std::size_t n = x.extent(0), d = static_cast<std::size_t>(mesh.data_size());
  REQUIRE(n % d == 0);
  const std::size_t local = n / d, first = local * static_cast<std::size_t>(mesh.data_rank());
  const auto x_local = rows_of(x, first, local), dy_local = rows_of(dy, first, local);

  const auto y_whole = host_vector(rows_of(whole.forward(space, x), first, local));
  const auto y_split = host_vector(split.forward(space, x_local));
  CHECK(max_abs_diff(y_split, y_whole) < 1e-12);

  whole.backward(space, dy, Model::Gradients::overwrite);
  split.backward(space, dy_local, Model::Gradients::overwrite);
  mesh.data().allreduce(space, split.gradients());
  space.fence();
  const auto expected = dist::shard_parameters(host_vector(whole.gradients()), whole, split);
  CHECK(max_abs_diff(host_vector(split.gradients()), expected) < 1e-11);
}

// check_sharded_step on `whole`'s parameters and an n-sample batch of U(-1, 1) entries.
void check_sharded_step(TensorParallelMesh &mesh, Model &whole, Model &split, std::size_t n,
                        std::uint64_t seed) {
  dist::copy_sharded_parameters(Space(), whole, split);
  check_sharded_step(mesh, whole, split, random_matrix<double>(n, whole.input_shape().size(), seed),
                     random_matrix<double>(n, whole.output_shape().size(), seed + 1));
}

// A transformer MLP block over `width` features at each position: LayerNorm, Dense to `hidden`,
// GELU, Dense back; in `split` the two Dense layers are column- and row-parallel over the
// mesh's tensor group.
void add_megatron_mlp(Model &whole, Model &split, TensorParallelMesh &mesh, std::size_t width,
                      std::size_t hidden) {
  whole.add<nn::LayerNorm>(width);
  whole.add<nn::Dense>(width, hidden, true, nn::DenseInput::per_position);
  whole.add<nn::GELU>();
  whole.add<nn::Dense>(hidden, width, true, nn::DenseInput::per_position);
  split.add<nn::LayerNorm>(width);
  split.add<ColumnParallelDense>(width, hidden, true, nn::DenseInput::per_position, mesh.tensor());
  split.add<nn::GELU>();
  split.add<RowParallelDense>(hidden, width, true, nn::DenseInput::per_position, mesh.tensor());
}

// Every entry of v (a rank-1 or rank-2 view, contiguous) rounded to the nearest bf16 value, in
// place (exact in double).
template <class View> void round_to_bf16_in_place(const View &v) {
  auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), v);
  for (std::size_t k = 0; k < h.span(); ++k)
    h.data()[k] = round_to_bf16(h.data()[k]);
  Kokkos::deep_copy(v, h);
}

TEST_CASE("tensor parallel: shard indices split each group of rows across the ranks",
          "[tensor_parallel]") {
  using dist::detail::shard_indices;
  CHECK(shard_indices("f", 8, 1, 1, 2) == std::vector<std::size_t>{4, 5, 6, 7});
  // Q|K|V of 2 heads of width 2 on 2 ranks: rank 1 owns head 1's query, key and value rows.
  CHECK(shard_indices("f", 12, 3, 1, 2) == std::vector<std::size_t>{2, 3, 6, 7, 10, 11});
  CHECK(shard_indices("f", 6, 3, 0, 1) == std::vector<std::size_t>{0, 1, 2, 3, 4, 5});
  CHECK_THROWS_WITH(shard_indices("f", 10, 3, 0, 2),
                    Catch::Contains("(10) must be a multiple of groups (3) x tensor-parallel "
                                    "ranks (2)"));
}

TEST_CASE("tensor parallel: a Megatron MLP on T ranks equals the single-rank MLP",
          "[mpi][tensor_parallel]") {
  auto world = Communicator::world();
  INFO(rank_of(world));
  const Space space;
  const FeatureShape in{8, 3, 2}; // 6 positions of 8 features
  const std::size_t n = 4, positions = 6, width = 8, hidden = 16;
  // A generator, not a loop: Catch enters each SECTION once per run of the test case, so in a
  // loop the sections below would see only T = 1.
  const std::vector<int> all_degrees = degrees(world.size(), hidden);
  const int t = GENERATE_COPY(from_range(all_degrees));
  INFO("T = " << t);
  TensorParallelMesh mesh(world, t);
  Model whole(in), split(in);
  add_megatron_mlp(whole, split, mesh, width, hidden);
  whole.compile(space, 5);
  split.compile(space, 6);
  const std::size_t batch = n * std::size_t(mesh.data_size());
  SECTION("and all-reduces one activation forward and one backward") {
    CHECK(split.parameter_count() == 2 * width + (width + 1) * hidden / std::size_t(t) +
                                         hidden / std::size_t(t) * width + width);
    mesh.tensor().reset_stats();
    check_sharded_step(mesh, whole, split, batch, 41);
    const auto stats = mesh.tensor().stats();
    // Exactly one forward all-reduce (the row-parallel output) and one backward all-reduce
    // (the column-parallel input gradient), each of the local batch's N x P x width
    // activation.
    const std::uint64_t activation = n * positions * width * sizeof(double);
    CHECK(stats.allreduce.calls == 1);
    CHECK(stats.allreduce.bytes == activation);
    CHECK(stats.iallreduce.calls == 1);
    CHECK(stats.iallreduce.bytes == activation);
    CHECK(stats.allgather.calls == 0);
    CHECK(stats.reduce_scatter.calls == 0);
  }
  // set_precision reaches the local Dense that holds a column- or row-parallel layer's
  // shard. The parameters and dy are bf16 values, so that the bias each side adds (rounded
  // into a bf16 Dense's product; after the all-reduce, unrounded, in a row-parallel one) and
  // the sums of dy for its gradient are the same numbers: the two models then differ by
  // summation order alone, while a layer left in fp32 would differ from its bf16 counterpart
  // by the rounding of its inputs (about 2^-9 of each).
  SECTION("in bf16") {
    round_to_bf16_in_place(whole.parameters());
    dist::copy_sharded_parameters(space, whole, split);
    const auto x = random_matrix<double>(batch, in.size(), 43);
    const auto dy = random_matrix<double>(batch, in.size(), 44);
    round_to_bf16_in_place(dy);
    // The bf16 products make a difference here (else the comparison below would not tell).
    const auto y_fp32 = host_vector(whole.forward(space, x));
    whole.set_precision(Precision::bf16);
    split.set_precision(Precision::bf16);
    CHECK(max_abs_diff(host_vector(whole.forward(space, x)), y_fp32) > 1e-4);
    for (const auto &layer : split.layers()) {
      if (const auto *column = dynamic_cast<const ColumnParallelDense<double, Mem> *>(layer.get()))
        CHECK(column->local().precision() == Precision::bf16);
      if (const auto *row = dynamic_cast<const RowParallelDense<double, Mem> *>(layer.get()))
        CHECK(row->local().precision() == Precision::bf16);
    }
    check_sharded_step(mesh, whole, split, x, dy);
  }
}

TEST_CASE("tensor parallel: a ViT split by heads and MLP on T ranks equals the single-rank ViT",
          "[mpi][tensor_parallel]") {
  auto world = Communicator::world();
  INFO(rank_of(world));
  const FeatureShape image{1, 28, 28};
  nn::models::VitOptions o;
  o.patch = {7, 7}; // 16 tokens
  o.width = 8;
  o.depth = 2;
  o.heads = 4;
  o.mlp_hidden = 16;
  const std::size_t n = 2, tokens = 16;
  // A generator, not a loop, as in the MLP's test.
  const std::vector<int> all_degrees = degrees(world.size(), o.heads);
  const int t = GENERATE_COPY(from_range(all_degrees));
  INFO("T = " << t);
  TensorParallelMesh mesh(world, t);
  SECTION("every block split (Megatron's plan)") {
    auto whole = nn::models::vit<double, Mem>(image, 10, o);
    auto split = dist::vit_tensor_parallel<double, Mem>(image, 10, o, mesh.tensor());
    whole.compile(Space(), 3);
    split.compile(Space(), 4);
    mesh.tensor().reset_stats();
    check_sharded_step(mesh, whole, split, n * std::size_t(mesh.data_size()), 51);
    const auto stats = mesh.tensor().stats();
    const std::uint64_t activation = n * tokens * o.width * sizeof(double);
    CHECK(stats.allreduce.calls == 2 * o.depth);
    CHECK(stats.allreduce.bytes == 2 * o.depth * activation);
    CHECK(stats.iallreduce.calls == 2 * o.depth);
    CHECK(stats.iallreduce.bytes == 2 * o.depth * activation);
  }
  SECTION("the first block's attention split, the rest replicated") {
    std::vector<dist::TensorParallelSplit> splits(o.depth, {false, false});
    splits[0].attention = true;
    auto whole = nn::models::vit<double, Mem>(image, 10, o);
    auto split = dist::vit_tensor_parallel<double, Mem>(image, 10, o, mesh.tensor(), splits);
    whole.compile(Space(), 3);
    split.compile(Space(), 4);
    mesh.tensor().reset_stats();
    check_sharded_step(mesh, whole, split, n * std::size_t(mesh.data_size()), 52);
    const auto stats = mesh.tensor().stats();
    const std::uint64_t activation = n * tokens * o.width * sizeof(double);
    CHECK(stats.allreduce.bytes == activation);
    CHECK(stats.iallreduce.bytes == activation);
  }
}

TEST_CASE("tensor parallel: bad splits name the sizes", "[mpi][tensor_parallel]") {
  auto world = Communicator::world();
  CHECK_THROWS_WITH(TensorParallelMesh(world, world.size() + 1),
                    Catch::Contains("tensor_parallel must be >= 1 and divide the"));
  TensorParallelMesh mesh(world, 1);
  using Column = ColumnParallelDense<double, Mem>;
  CHECK_THROWS_WITH(Column(4, 10, true, nn::DenseInput::per_position, mesh.tensor(), 3),
                    Catch::Contains("out_features: the split dimension (10) must be a multiple "
                                    "of groups (3)"));
  nn::models::VitOptions o;
  o.width = 8;
  o.heads = 4;
  o.depth = 2;
  const auto one_split = [&] {
    return dist::vit_tensor_parallel<double, Mem>(FeatureShape{1, 28, 28}, 10, o, mesh.tensor(),
                                                  {dist::TensorParallelSplit{}});
  };
  CHECK_THROWS_WITH(one_split(), Catch::Contains("one per block (2), got 1"));
}

TEST_CASE("tensor parallel: a plan searched for the ViT runs with the bytes it predicts",
          "[mpi][tensor_parallel][plan]") {
  auto world = Communicator::world();
  INFO(rank_of(world));
  const FeatureShape image{1, 28, 28};
  nn::models::VitOptions o;
  o.patch = {7, 7};
  o.width = 8;
  o.depth = 2;
  o.heads = 4;
  o.mlp_hidden = 16;
  const std::size_t n = 2; // per data-parallel replica
  for (const int t : degrees(world.size(), o.heads)) {
    INFO("T = " << t);
    TensorParallelMesh mesh(world, t);
    auto whole = nn::models::vit<double, Mem>(image, 10, o);
    whole.compile(Space(), 3);
    // Slow arithmetic makes splitting pay; only plans the executor runs.
    plan::CostModel cm;
    cm.cluster = plan::mpi_local_cluster();
    cm.cluster.flop_rate = 1e3;
    cm.mesh = {mesh.data_size(), t};
    cm.optimizer = plan::OptimizerMemory::sgd();
    plan::SearchOptions so;
    so.allowed = plan::megatron_executor_allows;
    const auto graph = whole.describe(static_cast<std::int64_t>(n) * mesh.data_size());
    const plan::Plan p = plan::search(graph, cm, so);
    const auto splits = dist::tensor_parallel_splits(p, whole, t);
    REQUIRE(splits.size() == o.depth);
    if (t > 1) {
      CHECK(splits[0].attention);
      CHECK(splits[0].mlp);
    }
    auto split = dist::vit_tensor_parallel<double, Mem>(image, 10, o, mesh.tensor(), splits);
    split.compile(Space(), 4);
    mesh.tensor().reset_stats();
    mesh.data().reset_stats();
    check_sharded_step(mesh, whole, split, n * std::size_t(mesh.data_size()), 61);
    double tensor_bytes = 0, data_bytes = 0;
    for (const auto &c : p.collectives)
      (c.group == plan::Group::tensor ? tensor_bytes : data_bytes) += c.bytes;
    const auto ts = mesh.tensor().stats();
    CHECK(static_cast<double>(ts.allreduce.bytes + ts.iallreduce.bytes) == tensor_bytes);
    if (mesh.data_size() > 1) {
      // check_sharded_step all-reduces the whole local gradient once over the data group.
      CHECK(static_cast<double>(mesh.data().stats().allreduce.bytes) == data_bytes);
    }
  }
}

} // namespace test_tensor_parallel

#endif
