#pragma once
/// @file
/// @brief MPI helpers behind kat::distributed::Communicator: datatypes, operations, error strings,
/// device-memory awareness. Users must not include this header; it is the one place besides
/// communicator.hpp that names MPI.

#ifndef KAT_ENABLE_MPI
// KAT::kat defines KAT_ENABLE_MPI and links MPI::MPI_CXX when configured with MPI.
#error "kat/distributed needs MPI: configure KAT with -DKAT_ENABLE_MPI=ON"
#else

#include "kat/core/bfloat16.hpp"

#include <Kokkos_Core.hpp>
#include <mpi.h>
#if __has_include(<mpi-ext.h>)
// Open MPI's extensions: MPIX_CUDA_AWARE_SUPPORT, MPIX_Query_cuda_support(), and in Open MPI 5
// the ROCm equivalents.
#include <mpi-ext.h>
#endif

#include <cstdint>
#include <string>
#include <type_traits>

namespace kat::distributed::detail {

/// Scalars the collectives accept.
template <class T>
inline constexpr bool is_mpi_scalar_v =
    std::is_same_v<T, float> || std::is_same_v<T, double> || std::is_same_v<T, std::int32_t> ||
    std::is_same_v<T, std::int64_t> || std::is_same_v<T, kat::bfloat16>;

template <class T> MPI_Datatype mpi_datatype() {
  static_assert(is_mpi_scalar_v<T>, "kat::distributed: collectives take float, double, "
                                    "std::int32_t, std::int64_t or kat::bfloat16 views");
  if constexpr (std::is_same_v<T, kat::bfloat16>) {
    return MPI_UINT16_T; // its bits; reductions use bfloat16_sum_op()
  } else if constexpr (std::is_same_v<T, float>) {
    return MPI_FLOAT;
  } else if constexpr (std::is_same_v<T, double>) {
    return MPI_DOUBLE;
  } else if constexpr (std::is_same_v<T, std::int32_t>) {
    return MPI_INT32_T;
  } else {
    return MPI_INT64_T;
  }
}

/// The element-wise sum of bfloat16 values for MPI: each addition in float, rounded to
/// bfloat16 (PyTorch's bfloat16 `+=`, as the DASO reference's MPI operation does).
inline void bfloat16_sum(void *in, void *inout, int *length, MPI_Datatype *) {
  const auto *a = static_cast<const kat::bfloat16 *>(in);
  auto *b = static_cast<kat::bfloat16 *>(inout);
  for (int i = 0; i < *length; ++i) {
    b[i] = kat::bfloat16::from_float(a[i].to_float() + b[i].to_float());
  }
}

/// MPI's operation for bfloat16_sum, created at first use and freed at MPI_Finalize (through
/// the delete callback of an attribute on MPI_COMM_SELF, which MPI_Finalize frees first).
inline MPI_Op bfloat16_sum_op() {
  static MPI_Op op = [] {
    MPI_Op created = MPI_OP_NULL;
    MPI_Op_create(&bfloat16_sum, /*commute=*/1, &created);
    int key = MPI_KEYVAL_INVALID;
    MPI_Comm_create_keyval(
        MPI_COMM_NULL_COPY_FN,
        [](MPI_Comm, int, void *value, void *) {
          auto *handle = static_cast<MPI_Op *>(value);
          MPI_Op_free(handle);
          delete handle;
          return MPI_SUCCESS;
        },
        &key, nullptr);
    MPI_Comm_set_attr(MPI_COMM_SELF, key, new MPI_Op(created));
    MPI_Comm_free_keyval(&key);
    return created;
  }();
  return op;
}

/// MPI's text for an error code ("MPI_ERR_ROOT: invalid root").
inline std::string error_string(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  if (MPI_Error_string(code, text, &length) != MPI_SUCCESS) {
    return "MPI error code " + std::to_string(code);
  }
  return std::string(text, static_cast<std::size_t>(length));
}

/// True between MPI_Init and MPI_Finalize: only then may MPI be called (destructors of
/// objects that outlive MPI_Finalize must not free handles).
inline bool mpi_active() {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  return initialized && !finalized;
}

/// Whether MPI may be handed pointers to the device memory of Kokkos's GPU backend. Known only
/// through Open MPI's extensions (MPIX_Query_cuda_support, and MPIX_Query_rocm_support in Open
/// MPI 5); any other MPI, or an Open MPI built without GPU support, is assumed to read host
/// memory only, so device views are staged through host memory.
inline bool mpi_reads_device_memory() {
#if defined(KOKKOS_ENABLE_CUDA) && defined(MPIX_CUDA_AWARE_SUPPORT) && MPIX_CUDA_AWARE_SUPPORT
  return MPIX_Query_cuda_support() == 1;
#elif defined(KOKKOS_ENABLE_HIP) && defined(MPIX_ROCM_AWARE_SUPPORT) && MPIX_ROCM_AWARE_SUPPORT
  return MPIX_Query_rocm_support() == 1;
#else
  return false;
#endif
}

/// Contiguous host memory MPI reads and writes when a view is staged.
template <class T> using HostBuffer = Kokkos::View<T *, Kokkos::LayoutLeft, Kokkos::HostSpace>;

/// A contiguous view as a rank-1 unmanaged view over the same memory.
template <class View> auto flat(const View &v) {
  return Kokkos::View<typename View::value_type *, Kokkos::LayoutLeft, typename View::memory_space,
                      Kokkos::MemoryTraits<Kokkos::Unmanaged>>(v.data(), v.size());
}

/// y(i) *= factor (scale). A named functor rather than an extended device lambda: nvcc's
/// wrapper of an extended lambda in a header is merged across translation units while its
/// function pointers are not (docs/backends.md).
template <class FlatView> struct ScaleInPlace {
  FlatView y;
  typename FlatView::value_type factor;

  KOKKOS_INLINE_FUNCTION void operator()(const std::size_t i) const { y(i) *= factor; }
};

/// y *= factor on `space`.
template <class ExecSpace, class FlatView>
void scale(const ExecSpace &space, const FlatView &y, typename FlatView::value_type factor) {
  Kokkos::parallel_for("kat::distributed::average::scale",
                       Kokkos::RangePolicy<ExecSpace>(space, 0, y.extent(0)),
                       ScaleInPlace<FlatView>{y, factor});
}

} // namespace kat::distributed::detail

#endif // KAT_ENABLE_MPI
