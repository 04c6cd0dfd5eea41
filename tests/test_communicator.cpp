// kat::distributed::Communicator against closed forms. ctest runs these ("[mpi]") under mpiexec at
// 1, 2 and 4 ranks (tests mpi_ranks_*); each test holds for any rank count, and every rank takes
// the same path through the collectives (CHECK, not REQUIRE, where ranks could differ), so a
// failure is reported instead of hanging. Compiles to nothing without KAT_ENABLE_MPI.
#ifdef KAT_ENABLE_MPI

#include "mpi_test_helpers.hpp"

#include <kat/distributed/comm/communicator.hpp>

#include <catch2/catch.hpp>
#include <mpi.h>

#include <cstdint>
#include <string>
#include <vector>

namespace test_communicator {

using namespace kat;
using namespace kat::test;
using kat::distributed::Communicator;
using kat::distributed::CommunicatorOptions;
using kat::distributed::MPIError;
using kat::distributed::ReduceOp;
using kat::distributed::Request;
using kat::distributed::Staging;

namespace {

// The elements of a contiguous view in memory order, as doubles.
template <class View> std::vector<double> values(const View &v) {
  auto h = to_host(v);
  std::vector<double> out(h.size());
  for (std::size_t k = 0; k < h.size(); ++k)
    out[k] = static_cast<double>(h.data()[k]);
  return out;
}

// The world ranks of the members of `comm`, in comm's rank order.
std::vector<double> members(Communicator &comm, int world_rank) {
  auto mine = vector_of<std::int64_t>(1, [&](std::size_t) { return world_rank; });
  Vector<std::int64_t, Mem> all("all", comm.size());
  comm.allgather(Space(), mine, all);
  return values(all);
}

} // namespace

TEST_CASE("communicator: world wraps MPI_COMM_WORLD and moves", "[mpi][dist]") {
  int rank = -1, size = -1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  auto world = Communicator::world();
  CHECK(world.rank() == rank);
  CHECK(world.size() == size);
  CHECK(world.native() == MPI_COMM_WORLD);
  CHECK_FALSE(world.owns_handle());
  CHECK(world.checked());
  CHECK(world.staging() == Staging::automatic);
  CHECK_FALSE(world.stages<Kokkos::HostSpace>());

  Communicator moved = std::move(world);
  CHECK(world.is_null());
  CHECK(moved.rank() == rank);
  CHECK_THROWS_AS(world.barrier(), Error);
  moved.barrier();
  CHECK_THROWS_AS(moved.set_ranks_per_virtual_node(-1), ValueError);
  CommunicatorOptions bad;
  bad.ranks_per_virtual_node = -2;
  CHECK_THROWS_AS(Communicator::world(bad), ValueError);
  CHECK_THROWS_AS(Communicator::borrow(MPI_COMM_NULL), ValueError);
}

TEMPLATE_TEST_CASE("communicator: allreduce of rank-dependent values equals the closed forms",
                   "[mpi][dist]", float, double, std::int32_t, std::int64_t) {
  using T = TestType;
  auto comm = Communicator::world();
  const long P = comm.size(), r = comm.rank();
  const std::size_t n = 5;
  auto x = [&] { return vector_of<T>(n, [&](std::size_t i) { return (r + 1) * long(i + 1); }); };

  auto sum = x(), max = x(), min = x();
  comm.allreduce(Space(), sum);
  comm.allreduce(Space(), max, ReduceOp::max);
  comm.allreduce(Space(), min, ReduceOp::min);
  const auto s = values(sum), hi = values(max), lo = values(min);
  for (std::size_t i = 0; i < n; ++i) {
    CHECK(s[i] == double(i + 1) * P * (P + 1) / 2);
    CHECK(hi[i] == double(i + 1) * P);
    CHECK(lo[i] == double(i + 1));
  }

  // Out of place from a const view: the input is untouched.
  const Kokkos::View<const T *, Kokkos::LayoutLeft, Mem> in = x();
  Vector<T, Mem> out("out", n);
  comm.allreduce(Space(), in, out);
  CHECK(values(out) == s);
  CHECK(values(in) == values(x()));
  comm.allreduce(Space(), in, out, ReduceOp::max);
  CHECK(values(out) == hi);

  // A column-major matrix is reduced as its elements in memory order.
  auto m = matrix_of<T>(3, 2, [&](std::size_t i, std::size_t j) { return r + long(i + 3 * j); });
  comm.allreduce(Space(), m);
  auto mh = to_host(m);
  for (std::size_t j = 0; j < 2; ++j)
    for (std::size_t i = 0; i < 3; ++i)
      CHECK(double(mh(i, j)) == double(P * (P - 1) / 2 + P * long(i + 3 * j)));
}

TEMPLATE_TEST_CASE("communicator: average equals the mean over ranks", "[mpi][dist]", float,
                   double) {
  using T = TestType;
  auto comm = Communicator::world();
  const int P = comm.size(), r = comm.rank();
  auto v = vector_of<T>(4, [&](std::size_t i) { return r + 0.5 * i; });
  comm.average(Space(), v);
  const auto a = values(v);
  for (std::size_t i = 0; i < 4; ++i)
    CHECK(a[i] == Approx((P - 1) / 2.0 + 0.5 * i).epsilon(1e-6));

  auto m = matrix_of<T>(2, 3, [&](std::size_t i, std::size_t j) { return 2.0 * r + i + j; });
  Matrix<T, Mem> mean("mean", 2, 3);
  comm.average(Space(), m, mean);
  auto mh = to_host(mean);
  for (std::size_t j = 0; j < 3; ++j)
    for (std::size_t i = 0; i < 2; ++i)
      CHECK(double(mh(i, j)) == Approx(double(P - 1) + i + j).epsilon(1e-6));
}

TEMPLATE_TEST_CASE("communicator: broadcast copies the root's view from every root", "[mpi][dist]",
                   double, std::int64_t) {
  using T = TestType;
  auto comm = Communicator::world();
  const int P = comm.size(), r = comm.rank();
  for (int root = 0; root < P; ++root) {
    auto v = vector_of<T>(6, [&](std::size_t i) { return r == root ? 100 * root + long(i) : -1; });
    comm.broadcast(Space(), v, root);
    const auto b = values(v);
    for (std::size_t i = 0; i < 6; ++i)
      CHECK(b[i] == 100.0 * root + i);
  }
  auto m =
      matrix_of<T>(2, 2, [&](std::size_t i, std::size_t j) { return r * 10 + long(i + 2 * j); });
  comm.broadcast(Space(), m, P - 1);
  CHECK(values(m) == std::vector<double>{10.0 * (P - 1), 10.0 * (P - 1) + 1, 10.0 * (P - 1) + 2,
                                         10.0 * (P - 1) + 3});
}

TEMPLATE_TEST_CASE("communicator: allgather puts rank q's block at q times n", "[mpi][dist]", float,
                   std::int32_t) {
  using T = TestType;
  auto comm = Communicator::world();
  const int P = comm.size(), r = comm.rank();
  const std::size_t n = 3;
  auto in = vector_of<T>(n, [&](std::size_t i) { return 10 * r + long(i); });
  Vector<T, Mem> flat("flat", n * P);
  comm.allgather(Space(), in, flat);
  const auto f = values(flat);
  for (std::size_t k = 0; k < n * P; ++k)
    CHECK(f[k] == 10.0 * (k / n) + double(k % n));

  // Into an n x P column-major matrix: column q is rank q's contribution.
  Matrix<T, Mem> cols("cols", n, P);
  comm.allgather(Space(), in, cols);
  auto ch = to_host(cols);
  for (int q = 0; q < P; ++q)
    for (std::size_t i = 0; i < n; ++i)
      CHECK(double(ch(i, q)) == 10.0 * q + i);
}

TEMPLATE_TEST_CASE("communicator: reduce_scatter gives each rank the reduction of its block",
                   "[mpi][dist]", double, std::int64_t) {
  using T = TestType;
  auto comm = Communicator::world();
  const long P = comm.size(), r = comm.rank();
  const std::size_t m = 3;
  auto in = vector_of<T>(m * P, [&](std::size_t k) { return (r + 1) * long(k + 1); });
  Vector<T, Mem> out("out", m);
  comm.reduce_scatter(Space(), in, out);
  auto o = values(out);
  for (std::size_t i = 0; i < m; ++i)
    CHECK(o[i] == double(r * long(m) + long(i) + 1) * P * (P + 1) / 2);
  comm.reduce_scatter(Space(), in, out, ReduceOp::max);
  o = values(out);
  for (std::size_t i = 0; i < m; ++i)
    CHECK(o[i] == double(r * long(m) + long(i) + 1) * P);
}

TEST_CASE("communicator: non-blocking collectives equal the blocking ones", "[mpi][dist]") {
  for (Staging staging : {Staging::never, Staging::always}) {
    CommunicatorOptions options;
    options.staging = staging;
    auto comm = Communicator::world(options);
    const int P = comm.size(), r = comm.rank();
    auto x = [&] { return vector_of<double>(7, [&](std::size_t i) { return 1.5 * r + i; }); };

    auto blocking = x(), nonblocking = x();
    comm.allreduce(Space(), blocking);
    Request request = comm.iallreduce(Space(), nonblocking);
    CHECK(request.active());
    request.wait();
    CHECK_FALSE(request.active());
    request.wait(); // a completed request waits for nothing
    CHECK(values(nonblocking) == values(blocking));

    // Out of place, completed by polling test().
    auto in = x();
    Vector<double, Mem> max_blocking("max_blocking", 7), max_nonblocking("max_nonblocking", 7);
    comm.allreduce(Space(), in, max_blocking, ReduceOp::max);
    Request polled = comm.iallreduce(Space(), in, max_nonblocking, ReduceOp::max);
    while (!polled.test()) {
    }
    CHECK(polled.test());
    CHECK(values(max_nonblocking) == values(max_blocking));

    // The destructor completes the request (and copies a staged result back).
    auto b = vector_of<double>(5, [&](std::size_t i) { return r == P - 1 ? 7.0 * i : -1.0; });
    {
      Request pending = comm.ibroadcast(Space(), b, P - 1);
      Request moved = std::move(pending);
      CHECK_FALSE(pending.active());
    }
    CHECK(values(b) == std::vector<double>{0, 7, 14, 21, 28});
  }
  Request empty;
  CHECK_FALSE(empty.active());
  CHECK(empty.test());
  empty.wait();
}

TEST_CASE("communicator: isend and irecv pass a ring of messages counted and checked",
          "[mpi][dist]") {
  for (Staging staging : {Staging::never, Staging::always}) {
    CommunicatorOptions options;
    options.staging = staging;
    auto comm = Communicator::world(options).dup();
    const int P = comm.size(), r = comm.rank();
    const int next = (r + 1) % P, previous = (r + P - 1) % P;
    // Rank r sends 3 values to r + 1 with tag 5 and 2 with tag 6; the tags keep them apart
    // even though the receives are posted in the other order.
    auto a = vector_of<float>(3, [&](std::size_t i) { return 10.0f * r + float(i); });
    auto b = vector_of<std::int64_t>(2, [&](std::size_t i) { return 100 * r + std::int64_t(i); });
    Vector<float, Mem> got_a("got_a", 3);
    Vector<std::int64_t, Mem> got_b("got_b", 2);
    Request rb = comm.irecv(Space(), got_b, previous, 6);
    Request ra = comm.irecv(Space(), got_a, previous, 5);
    Request sa = comm.isend(Space(), a, next, 5);
    Request sb = comm.isend(Space(), b, next, 6);
    while (!ra.test()) {
    }
    rb.wait();
    sa.wait();
    sb.wait();
    const double p = previous;
    CHECK(values(got_a) == std::vector<double>{10 * p, 10 * p + 1, 10 * p + 2});
    CHECK(values(got_b) == std::vector<double>{100 * p, 100 * p + 1});
    const auto s = comm.stats();
    CHECK(s.send.calls == 2);
    CHECK(s.send.bytes == 3 * 4 + 2 * 8);
    CHECK(s.recv.calls == 2);
    CHECK(s.recv.bytes == 3 * 4 + 2 * 8);
    CHECK(s.total().bytes == 2 * (3 * 4 + 2 * 8));
    CHECK(s.shape_check.calls == 0); // nothing is agreed across ranks
    CHECK_THROWS_MATCHES(comm.isend(Space(), a, P, 0), ValueError,
                         MessageContains("dest must be a rank in [0, " + std::to_string(P) +
                                         ") on rank " + std::to_string(r)));
    CHECK_THROWS_MATCHES(comm.irecv(Space(), got_a, -1, 0), ValueError,
                         MessageContains("source must be a rank in"));
    CHECK_THROWS_MATCHES(comm.isend(Space(), a, next, -3), ValueError,
                         MessageContains("tag must be >= 0"));
    Kokkos::View<float **, Kokkos::LayoutLeft, Mem> m("m", 4, 3);
    CHECK_THROWS_MATCHES(
        comm.isend(Space(), Kokkos::subview(m, 1, Kokkos::ALL), next, 0), // a strided row
        ShapeError, MessageContains("must be contiguous"));
  }
}

TEST_CASE("communicator: staging always gives the same results as never on host memory",
          "[mpi][dist]") {
  // Every collective on the same inputs under both policies; 'always' copies through a fresh
  // host buffer even though the view is already host-accessible.
  const auto run = [](Staging staging) {
    CommunicatorOptions options;
    options.staging = staging;
    auto comm = Communicator::world(options);
    const int P = comm.size(), r = comm.rank();
    auto v = vector_of<float>(4, [&](std::size_t i) { return 0.25f * r + i; });
    std::vector<double> result;
    comm.allreduce(Space(), v);
    auto append = [&](const auto &view) {
      const auto vals = values(view);
      result.insert(result.end(), vals.begin(), vals.end());
    };
    append(v);
    Vector<float, Mem> out("out", 4);
    comm.allreduce(Space(), v, out, ReduceOp::min);
    append(out);
    comm.average(Space(), v);
    append(v);
    comm.broadcast(Space(), v, 0);
    append(v);
    Vector<float, Mem> gathered("gathered", 4 * P);
    comm.allgather(Space(), v, gathered);
    append(gathered);
    Vector<float, Mem> block("block", 4);
    comm.reduce_scatter(Space(), gathered, block);
    append(block);
    comm.iallreduce(Space(), v).wait();
    append(v);
    auto stats = comm.stats();
    CHECK(comm.stages<Mem>() == (staging == Staging::always));
    CHECK((stats.staging.bytes > 0) == (staging == Staging::always));
    (void)r;
    return result;
  };
  CHECK(run(Staging::always) == run(Staging::never));
  CHECK(run(Staging::automatic) == run(Staging::never));
}

TEST_CASE("communicator: byte and call counters equal the analytic counts", "[mpi][dist]") {
  auto comm = Communicator::world();
  const std::uint64_t P = comm.size();
  Vector<double, Mem> a("a", 7);
  Vector<float, Mem> b("b", 3);
  Vector<std::int32_t, Mem> c("c", 2), gathered("gathered", 2 * P);
  Vector<std::int64_t, Mem> d("d", 4 * P), block("block", 4);
  comm.reset_stats();
  comm.allreduce(Space(), a);
  comm.average(Space(), a);
  comm.broadcast(Space(), b, 0);
  comm.allgather(Space(), c, gathered);
  comm.reduce_scatter(Space(), d, block);
  comm.iallreduce(Space(), a).wait();
  comm.ibroadcast(Space(), b, 0).wait();
  comm.barrier();
  const auto s = comm.stats();
  CHECK(s.allreduce.calls == 2);
  CHECK(s.allreduce.bytes == 2 * 7 * 8);
  CHECK(s.broadcast.calls == 1);
  CHECK(s.broadcast.bytes == 3 * 4);
  CHECK(s.allgather.calls == 1);
  CHECK(s.allgather.bytes == 2 * 4); // this rank's contribution, not the P x 2 gathered
  CHECK(s.reduce_scatter.calls == 1);
  CHECK(s.reduce_scatter.bytes == 4 * P * 8); // the whole input
  CHECK(s.iallreduce.calls == 1);
  CHECK(s.iallreduce.bytes == 7 * 8);
  CHECK(s.ibroadcast.calls == 1);
  CHECK(s.ibroadcast.bytes == 3 * 4);
  CHECK(s.barrier.calls == 1);
  CHECK(s.barrier.bytes == 0);
  CHECK(s.shape_check.calls == 7);
  CHECK(s.shape_check.bytes == 7 * 40);
  CHECK(s.staging.calls == 0); // host memory, automatic staging
  CHECK(s.total().calls == 8);
  CHECK(s.total().bytes == 2 * 56 + 12 + 8 + 32 * P + 56 + 12);

  // Unchecked: no agreement all-reduce. Staged: one copy in, one copy out.
  comm.set_checked(false);
  comm.set_staging(Staging::always);
  comm.reset_stats();
  comm.allreduce(Space(), a);
  const auto u = comm.stats();
  CHECK(u.shape_check.calls == 0);
  CHECK(u.allreduce.bytes == 56);
  CHECK(u.staging.calls == 2);
  CHECK(u.staging.bytes == 2 * 56);
  // A broadcast root stages in only; the others copy out only.
  comm.reset_stats();
  comm.broadcast(Space(), a, 0);
  CHECK(comm.stats().staging.calls == 1);
}

TEST_CASE("communicator: split_shared and split_cross_node follow ranks_per_virtual_node",
          "[mpi][dist]") {
  CommunicatorOptions options;
  options.ranks_per_virtual_node = 2;
  auto world = Communicator::world(options);
  const int P = world.size(), r = world.rank();
  auto node = world.split_shared();
  auto cross = world.split_cross_node();
  CHECK(node.owns_handle());
  CHECK(node.ranks_per_virtual_node() == 2); // inherited

  std::vector<double> node_expected, cross_expected;
  for (int q = 0; q < P; ++q) {
    if (q / 2 == r / 2)
      node_expected.push_back(q);
    if (q % 2 == r % 2)
      cross_expected.push_back(q);
  }
  CHECK(members(node, r) == node_expected);
  CHECK(members(cross, r) == cross_expected);
  CHECK(node.rank() == r % 2);
  CHECK(cross.rank() == r / 2);
  if (P == 4) {
    CHECK(members(node, r) == (r < 2 ? std::vector<double>{0, 1} : std::vector<double>{2, 3}));
    CHECK(members(cross, r) ==
          (r % 2 == 0 ? std::vector<double>{0, 2} : std::vector<double>{1, 3}));
  }
  // A collective on the node communicator involves only the node.
  auto one = vector_of<std::int32_t>(1, [](std::size_t) { return 1; });
  node.allreduce(Space(), one);
  CHECK(values(one)[0] == double(node_expected.size()));
}

TEST_CASE("communicator: real nodes and generic split and dup and the null communicator",
          "[mpi][dist]") {
  auto world = Communicator::world();
  const int P = world.size(), r = world.rank();
  // The ranks of a ctest run share one machine.
  auto node = world.split_shared();
  CHECK(node.size() == P);
  CHECK(node.rank() == r);
  auto cross = world.split_cross_node();
  CHECK(cross.size() == 1);

  // Same parity, ordered by descending world rank.
  auto parity = world.split(r % 2, -r);
  std::vector<double> expected;
  for (int q = P - 1; q >= 0; --q)
    if (q % 2 == r % 2)
      expected.push_back(q);
  CHECK(members(parity, r) == expected);

  auto copy = world.dup();
  CHECK(copy.owns_handle());
  CHECK(copy.native() != MPI_COMM_WORLD);
  CHECK(copy.rank() == r);
  CHECK(copy.size() == P);
  int result = MPI_UNEQUAL;
  MPI_Comm_compare(copy.native(), MPI_COMM_WORLD, &result);
  CHECK(result == MPI_CONGRUENT);

  auto evens = world.split(r % 2 == 0 ? 0 : Communicator::undefined_color, r);
  CHECK(evens.is_null() == (r % 2 == 1));
  if (evens.is_null()) {
    CHECK_THROWS_AS(evens.barrier(), Error);
  } else {
    CHECK(evens.size() == (P + 1) / 2);
  }
  CHECK_THROWS_AS(world.split(-5, 0), ValueError);
}

TEST_CASE("communicator: mismatched arguments throw on every rank instead of hanging",
          "[mpi][dist]") {
  auto comm = Communicator::world();
  const int P = comm.size(), r = comm.rank();
  const std::string me = rank_of(comm);

  if (P > 1) {
    Vector<double, Mem> v("v", 3 + r);
    CHECK_THROWS_WITH(comm.allreduce(Space(), v),
                      Catch::Contains("element counts differ") && Catch::Contains(me) &&
                          Catch::Contains("passed " + std::to_string(3 + r)) &&
                          Catch::Contains("minimum is 3") &&
                          Catch::Contains("maximum " + std::to_string(2 + P)));
    CHECK_THROWS_AS(comm.iallreduce(Space(), v), ShapeError);
    CHECK_THROWS_AS(comm.broadcast(Space(), v, 0), ShapeError);
    Vector<double, Mem> w("w", 2);
    CHECK_THROWS_WITH(comm.broadcast(Space(), w, r), Catch::Contains("roots differ"));
    CHECK_THROWS_AS(comm.ibroadcast(Space(), w, r), ValueError);
  }

  // A local error on the last rank only: that rank names it, the others learn of it.
  const bool culprit = r == P - 1;
  Vector<double, Mem> in("in", 4), out("out", culprit ? 5 : 4);
  CHECK_THROWS_WITH(comm.allreduce(Space(), in, out),
                    culprit ? Catch::Contains("must have in.size() = 4 elements, got 5")
                            : Catch::Contains("arguments on another rank are invalid"));
  Vector<double, Mem> gathered("gathered", culprit ? 4 * P + 1 : 4 * P);
  CHECK_THROWS_AS(comm.allgather(Space(), in, gathered), ShapeError);
  Vector<double, Mem> block("block", culprit ? 2 : 4);
  Vector<double, Mem> input("input", 4 * P);
  CHECK_THROWS_AS(comm.reduce_scatter(Space(), input, block), ShapeError);
  // A non-contiguous view (a matrix row).
  Matrix<double, Mem> m("m", 3, 3);
  auto strided = Kokkos::subview(m, 1, Kokkos::ALL);
  auto column = Kokkos::subview(m, Kokkos::ALL, 1);
  if (culprit) {
    CHECK_THROWS_WITH(comm.allreduce(Space(), strided), Catch::Contains("must be contiguous"));
  } else {
    CHECK_THROWS_AS(comm.allreduce(Space(), column), ShapeError);
  }

  // Unchecked: local errors still throw, without any MPI call (here on every rank).
  comm.set_checked(false);
  comm.reset_stats();
  Vector<double, Mem> wrong("wrong", 3);
  CHECK_THROWS_AS(comm.allreduce(Space(), in, wrong), ShapeError);
  CHECK(comm.stats().shape_check.calls == 0);
  comm.set_checked(true);

  // The communicator still works.
  auto ones = vector_of<double>(2, [](std::size_t) { return 1.0; });
  comm.allreduce(Space(), ones);
  CHECK(values(ones) == std::vector<double>{double(P), double(P)});
}

TEST_CASE("communicator: an MPI error becomes MPIError naming the collective and the rank",
          "[mpi][dist]") {
  auto comm = Communicator::world();
  const int P = comm.size();
  Vector<double, Mem> v("v", 3);
  const std::string me = rank_of(comm);
  int error_class = MPI_SUCCESS;
  try {
    comm.broadcast(Space(), v, P); // every rank passes the same, invalid, root
    FAIL("broadcast with root = size() did not throw");
  } catch (const MPIError &e) {
    CHECK_THAT(e.what(), Catch::Contains("kat::distributed::Communicator::broadcast") &&
                             Catch::Contains("MPI error on " + me));
    MPI_Error_class(e.code(), &error_class);
  }
  CHECK(error_class == MPI_ERR_ROOT);
  CHECK_THROWS_WITH(comm.ibroadcast(Space(), v, -3),
                    Catch::Contains("ibroadcast") && Catch::Contains(me));
  CHECK_THROWS_AS(comm.broadcast(Space(), v, P), kat::Error); // MPIError is a kat::Error
  comm.barrier();
}

} // namespace test_communicator

#endif // KAT_ENABLE_MPI
