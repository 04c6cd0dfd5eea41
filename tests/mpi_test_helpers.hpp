#pragma once
// Shared by the MPI tests (MPI builds only): the rank named in failure messages, and the small
// MLP the data-parallel and distributed K-FAC tests train.
#include "test_helpers.hpp"

#include <kat/distributed/comm/communicator.hpp>
#include <kat/nn/activation.hpp>
#include <kat/nn/dense.hpp>
#include <kat/nn/flatten.hpp>
#include <kat/nn/sequential.hpp>

#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

namespace kat::test {

// "rank r of P", for INFO().
inline std::string rank_of(const dist::Communicator &comm) {
  return "rank " + std::to_string(comm.rank()) + " of " + std::to_string(comm.size());
}

// Whether `text` is the same on every rank of `comm` (collective): its hash compared through
// one max and one min all-reduce.
inline bool same_on_every_rank(dist::Communicator &comm, const std::string &text) {
  const auto h = static_cast<std::int64_t>(std::hash<std::string>()(text) >> 1);
  Kokkos::View<std::int64_t *, Kokkos::HostSpace> v("hashes", 2);
  v(0) = h;
  v(1) = -h;
  comm.allreduce(Kokkos::DefaultHostExecutionSpace(), v, dist::ReduceOp::max);
  return v(0) == -v(1);
}

// Whether `values` are the same, bit for bit, on every rank of `comm` (collective).
inline bool same_on_every_rank(dist::Communicator &comm, const std::vector<double> &values) {
  std::string bytes(values.size() * sizeof(double), '\0');
  if (!values.empty()) {
    std::memcpy(&bytes[0], values.data(), bytes.size());
  }
  return same_on_every_rank(comm, bytes);
}

// Flatten, Dense(6, 12), Tanh, Dense(12, 8), ReLU, Dense(8, 4): the Dense layers are model
// layers 1, 3, 5 with 84, 104 and 36 parameters, out 12, 8, 4 and in+1 7, 13, 9 (K-FAC factors
// A of 7, 13, 9 and G of 12, 8, 4).
inline void build_mlp(nn::Sequential<double, Mem> &model, std::uint64_t seed) {
  model.add<nn::Flatten>();
  model.add<nn::Dense>(6, 12);
  model.add<nn::Tanh>();
  model.add<nn::Dense>(12, 8);
  model.add<nn::ReLU>();
  model.add<nn::Dense>(8, 4);
  model.compile(Space(), seed);
}

} // namespace kat::test
