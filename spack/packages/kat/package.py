# Spack recipe for KAT (Kokkos Accelerated Training), a header-only C++17 library.
#
# KAT has no public release or download address yet, so this recipe names none (no url, no
# git, no checksum): it builds a local checkout through Spack's development workflow,
#
#   spack repo add /path/to/kat/spack
#   spack develop --path /path/to/kat kat@0.2.0   (inside an environment)
#   spack add kat@0.2.0 +mpi +cuda cuda_arch=90 && spack install
#
# (docs/install.md). The CMake options below are checked against CMakeLists.txt by
# tests/packaging/check_spack_recipe.py; Spack itself was not available to test the recipe.
from spack.package import *


class Kat(CMakePackage, CudaPackage, ROCmPackage):
    """KAT (Kokkos Accelerated Training): layers, K-FAC, FOSI, sparse training masks and
    distributed training schemes as generic templates over Kokkos views, for the Serial,
    OpenMP, CUDA and HIP backends, with MPI for distribution."""

    # No homepage or url: KAT is not published yet (see the comment above).

    version("0.2.0")

    variant("mpi", default=True, description="Distributed training over MPI (KAT_ENABLE_MPI)")
    variant("openmp", default=True, description="Kokkos and Kokkos Kernels with the OpenMP backend")
    variant(
        "onednn",
        default=False,
        description="Conv2d, BatchNorm2d and float GEMMs on host memory through oneDNN",
    )
    variant("tests", default=False, description="Build the Catch2 test suite (KAT_ENABLE_TESTS)")
    variant(
        "examples",
        default=False,
        description="Build the examples: kat_train, kat_plan (KAT_ENABLE_EXAMPLES)",
    )

    conflicts("+cuda", when="+rocm", msg="KAT is built for one GPU backend at a time")

    depends_on("cmake@3.16:", type="build")
    depends_on("cmake@3.17:", type="build", when="+cuda")  # FindCUDAToolkit for cuSOLVER

    # Kokkos 3.4 (as in Debian 12) or 4.x; KAT writes to the API common to both.
    depends_on("kokkos@3.4:")
    depends_on("kokkos-kernels@3.4:")

    # The backend, propagated to Kokkos and Kokkos Kernels.
    depends_on("kokkos+openmp", when="+openmp")
    depends_on("kokkos-kernels+openmp", when="+openmp")
    depends_on("kokkos+cuda+wrapper", when="+cuda")
    # KOKKOS_LAMBDA on CUDA (the tests and examples use it): a variant of Kokkos 3, always on
    # from Kokkos 4.0.
    depends_on("kokkos+cuda_lambda", when="+cuda ^kokkos@:3")
    depends_on("kokkos-kernels+cuda+cublas", when="+cuda")
    for _arch in CudaPackage.cuda_arch_values:
        depends_on(f"kokkos cuda_arch={_arch}", when=f"+cuda cuda_arch={_arch}")
    depends_on("kokkos+rocm", when="+rocm")
    for _target in ROCmPackage.amdgpu_targets:
        depends_on(f"kokkos amdgpu_target={_target}", when=f"+rocm amdgpu_target={_target}")
    # The vendor solvers of kat/core/linalg.hpp on GPU memory (CudaPackage brings cuda itself).
    depends_on("rocsolver", when="+rocm")
    depends_on("rocblas", when="+rocm")

    # Host linear algebra (K-FAC's eigendecompositions), gzip'd data sets.
    depends_on("blas")
    depends_on("lapack")
    depends_on("zlib-api")
    depends_on("mpi", when="+mpi")
    depends_on("onednn", when="+onednn")
    # Tests: Catch2 v2 (catch2/catch.hpp); tests and examples: nlohmann/json; examples: CLI11.
    depends_on("catch2@2", type=("build", "test"), when="+tests")
    depends_on("nlohmann-json@3:", when="+tests")
    depends_on("nlohmann-json@3:", when="+examples")
    depends_on("cli11", when="+examples")

    def cmake_args(self):
        spec = self.spec
        args = [
            self.define_from_variant("KAT_ENABLE_MPI", "mpi"),
            self.define_from_variant("KAT_ENABLE_TESTS", "tests"),
            self.define_from_variant("KAT_ENABLE_EXAMPLES", "examples"),
            self.define("KAT_ENABLE_BENCHMARKS", False),
            self.define_from_variant("KAT_ENABLE_ONEDNN", "onednn"),
            self.define_from_variant("KAT_ENABLE_CUSOLVER", "cuda"),
            self.define_from_variant("KAT_ENABLE_CUBLAS", "cuda"),
            self.define_from_variant("KAT_ENABLE_ROCSOLVER", "rocm"),
            # The BLAS and LAPACK Spack provides, not Debian's OpenMP OpenBLAS directory that
            # cmake/KATOpenMPBLAS.cmake looks for on a Debian system.
            self.define("KAT_OPENMP_BLAS_DIR", ""),
            self.define("Kokkos_ROOT", spec["kokkos"].prefix),
            self.define("KokkosKernels_ROOT", spec["kokkos-kernels"].prefix),
        ]
        if spec.satisfies("+rocm"):
            args.append(self.define("CMAKE_CXX_COMPILER", spec["hip"].hipcc))
        else:
            # nvcc_wrapper for a CUDA Kokkos, the Spack compiler otherwise.
            args.append(self.define("CMAKE_CXX_COMPILER", spec["kokkos"].kokkos_cxx))
        if spec.satisfies("+tests") and (spec.satisfies("+cuda") or spec.satisfies("+rocm")):
            # Test discovery runs kat_tests at build time, which needs the GPU; build nodes
            # often have none. Run tests/kat_tests on a GPU node instead.
            args.append(self.define("KAT_DISCOVER_TESTS", False))
        return args
