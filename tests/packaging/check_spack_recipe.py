#!/usr/bin/env python3
"""Checks KAT's Spack recipe (spack/packages/kat/package.py) without Spack.

Spack cannot be installed here, so a small stand-in for `spack.package` (the directives, the
CMakePackage/CudaPackage/ROCmPackage bases, define/define_from_variant, and a spec that answers
`satisfies`) lets the recipe import as Spack would import it. Then:

  * the recipe's version is the one CMakeLists.txt's project() declares;
  * the variants the issue asks for exist, and every `when=` names only variants that exist;
  * Kokkos and Kokkos Kernels are dependencies, with the backend propagated (+openmp, +cuda with
    every cuda_arch, +rocm with every amdgpu_target);
  * for a set of variant combinations, cmake_args() runs, every -D it emits names an option or
    cache variable of KAT's CMake files (tests/packaging/kat_cmake_options.py), options get
    ON/OFF, and each variant reaches the CMake option it maps to.

    python3 tests/packaging/check_spack_recipe.py [RECIPE]
Exits 1 listing every problem.
"""
import importlib.util
import pathlib
import re
import sys
import types

sys.dont_write_bytecode = True
HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import kat_cmake_options  # noqa: E402

RECIPE = kat_cmake_options.ROOT / "spack" / "packages" / "kat" / "package.py"

# --- the stand-in for spack.package ------------------------------------------------------------
DIRECTIVES = []  # (kind, args, kwargs) in the order the class body calls them


def _directive(kind):
    def record(*args, **kwargs):
        DIRECTIVES.append((kind, args, kwargs))

    return record


class _Variant:
    def __init__(self, value):
        self.value = value


class _Dependency:
    """spec["name"]: a dependency's prefix and the attributes recipes read from it."""

    def __init__(self, name):
        self.name = name
        self.prefix = f"/spack/opt/{name}"
        self.kokkos_cxx = f"/spack/opt/{name}/kokkos_cxx"  # nvcc_wrapper or the compiler
        self.hipcc = f"/spack/opt/{name}/bin/hipcc"
        self.package = self


class _Spec:
    """A concrete spec of variant values: {name: bool | str | tuple}."""

    def __init__(self, variants):
        self.variants = {k: _Variant(v) for k, v in variants.items()}

    def _holds(self, token):
        if token.startswith("^"):
            return False  # dependencies' variants: not modelled
        if token.startswith(("+", "~")):
            name = token[1:]
            if name not in self.variants:
                raise KeyError(f"satisfies('{token}'): no variant '{name}'")
            return bool(self.variants[name].value) == (token[0] == "+")
        if "=" in token:
            name, value = token.split("=", 1)
            if name not in self.variants:
                raise KeyError(f"satisfies('{token}'): no variant '{name}'")
            v = self.variants[name].value
            return value in v if isinstance(v, tuple) else str(v) == value
        raise ValueError(f"satisfies('{token}'): the stand-in knows +x, ~x and x=v only")

    def satisfies(self, constraint):
        tokens = []
        for word in constraint.split():
            tokens += [word] if "=" in word or word.startswith("^") else re.findall(r"[+~][\w-]+", word)
        return all(self._holds(t) for t in tokens)

    def __contains__(self, constraint):
        return self.satisfies(constraint)

    def __getitem__(self, name):
        return _Dependency(name)


def _define(cmake_var, value):  # as spack.build_systems.cmake.define
    if isinstance(value, bool):
        kind, value = "BOOL", "ON" if value else "OFF"
    else:
        kind = "STRING"
    if isinstance(value, (list, tuple)):
        value = ";".join(str(v) for v in value)
    return f"-D{cmake_var}:{kind}={value}"


class CMakePackage:
    run_tests = False

    def __init__(self, spec):
        self.spec = spec

    def define(self, cmake_var, value):
        return _define(cmake_var, value)

    def define_from_variant(self, cmake_var, variant=None):
        variant = variant or cmake_var.lower()
        if variant not in self.spec.variants:
            raise KeyError(f"define_from_variant('{cmake_var}', '{variant}'): no variant "
                           f"'{variant}'")
        return _define(cmake_var, self.spec.variants[variant].value)


class CudaPackage:
    cuda_arch_values = ("60", "70", "75", "80", "86", "89", "90")


class ROCmPackage:
    amdgpu_targets = ("gfx906", "gfx908", "gfx90a", "gfx940", "gfx942", "gfx1030")


MIXIN_VARIANTS = {"cuda": False, "cuda_arch": (), "rocm": False, "amdgpu_target": ()}


def _install_stand_in():
    spack = types.ModuleType("spack")
    package = types.ModuleType("spack.package")
    for kind in ("version", "variant", "depends_on", "conflicts", "requires", "maintainers",
                 "license", "patch", "provides", "resource", "extends"):
        setattr(package, kind, _directive(kind))
    package.CMakePackage = CMakePackage
    package.CudaPackage = CudaPackage
    package.ROCmPackage = ROCmPackage
    package.__all__ = [n for n in vars(package) if not n.startswith("_")]
    spack.package = package
    sys.modules["spack"] = spack
    sys.modules["spack.package"] = package


# --- the checks --------------------------------------------------------------------------------
def main():
    recipe = pathlib.Path(sys.argv[1]) if len(sys.argv) > 1 else RECIPE
    _install_stand_in()
    spec_ = importlib.util.spec_from_file_location("kat_spack_recipe", recipe)
    module = importlib.util.module_from_spec(spec_)
    spec_.loader.exec_module(module)
    classes = [c for c in vars(module).values()
               if isinstance(c, type) and issubclass(c, CMakePackage) and c is not CMakePackage]
    problems = []
    if len(classes) != 1:
        sys.exit(f"{recipe}: expected one CMakePackage class, found {len(classes)}")
    Kat = classes[0]
    where = recipe.name

    # Versions.
    versions = [a[0] for k, a, _ in DIRECTIVES if k == "version"]
    project = kat_cmake_options.project_version()
    if project not in versions:
        problems.append(f"{where}: versions {versions} lack CMakeLists.txt's {project}")

    # Variants.
    defaults = dict(MIXIN_VARIANTS)
    for kind, args, kwargs in DIRECTIVES:
        if kind == "variant":
            defaults[args[0]] = kwargs.get("default", False)
    for name in ("mpi", "cuda", "rocm", "onednn", "tests"):
        if name not in defaults:
            problems.append(f"{where}: no variant '{name}'")
    if not issubclass(Kat, CudaPackage) or not issubclass(Kat, ROCmPackage):
        problems.append(f"{where}: the class must derive from CudaPackage and ROCmPackage")
    for kind, args, kwargs in DIRECTIVES:
        when = kwargs.get("when", "")
        for name in re.findall(r"[+~](\w+)", when) + re.findall(r"(\w+)=", when):
            if name not in defaults:
                problems.append(f"{where}: {kind}{args} when='{when}' names no variant '{name}'")

    # Dependencies and the backend's propagation.
    deps = [(a[0], k.get("when", "")) for kind, a, k in DIRECTIVES if kind == "depends_on"]

    def depends(prefix, when):
        return any(d.startswith(prefix) and w == when for d, w in deps)

    for name in ("kokkos", "kokkos-kernels", "blas", "lapack"):
        if not any(re.match(rf"{re.escape(name)}(@|$|\s|\+)", d) for d, _ in deps):
            problems.append(f"{where}: no dependency on {name}")
    expected = [("kokkos+openmp", "+openmp"), ("kokkos-kernels+openmp", "+openmp"),
                ("kokkos+cuda", "+cuda"), ("kokkos-kernels+cuda", "+cuda"),
                ("kokkos+rocm", "+rocm"), ("mpi", "+mpi"), ("onednn", "+onednn"),
                ("catch2@2", "+tests")]
    expected += [(f"kokkos cuda_arch={a}", f"+cuda cuda_arch={a}")
                 for a in CudaPackage.cuda_arch_values]
    expected += [(f"kokkos amdgpu_target={t}", f"+rocm amdgpu_target={t}")
                 for t in ROCmPackage.amdgpu_targets]
    for dep, when in expected:
        if not depends(dep, when):
            problems.append(f"{where}: no depends_on('{dep}...', when='{when}')")

    # cmake_args() for combinations of variants.
    booleans, others = kat_cmake_options.options()
    combos = [
        {},
        {"mpi": False, "openmp": False},
        {"tests": True, "examples": True, "onednn": True},
        {"cuda": True, "cuda_arch": ("90",), "tests": True},
        {"cuda": True, "cuda_arch": ("80",), "mpi": False},
        {"rocm": True, "amdgpu_target": ("gfx90a",), "openmp": False},
    ]
    mapping = {"KAT_ENABLE_MPI": "mpi", "KAT_ENABLE_TESTS": "tests",
               "KAT_ENABLE_ONEDNN": "onednn", "KAT_ENABLE_CUSOLVER": "cuda",
               "KAT_ENABLE_CUBLAS": "cuda",
               "KAT_ENABLE_ROCSOLVER": "rocm"}
    for combo in combos:
        variants = dict(defaults)
        variants.update(combo)
        label = " ".join(f"{k}={v}" for k, v in combo.items()) or "defaults"
        try:
            args = Kat(_Spec(variants)).cmake_args()
        except Exception as e:  # noqa: BLE001: any failure of the recipe is a finding
            problems.append(f"{where}: cmake_args() with {label} raised {type(e).__name__}: {e}")
            continue
        definitions = {}
        for arg in args:
            m = re.fullmatch(r"-D(\w+)(?::\w+)?=(.*)", arg)
            if not m:
                problems.append(f"{where}: cmake_args() with {label}: '{arg}' is not -DNAME=VALUE")
                continue
            definitions[m.group(1)] = m.group(2)
        problems += kat_cmake_options.check_definitions(
            f"{where}: cmake_args() with {label}", definitions, booleans, others)
        for option, variant in mapping.items():
            want = "ON" if variants[variant] else "OFF"
            if definitions.get(option) != want:
                problems.append(f"{where}: cmake_args() with {label}: {option} is "
                                f"{definitions.get(option)}, expected {want} (variant {variant})")
        print(f"{label}: {' '.join(args)}")

    for p in problems:
        print("check_spack_recipe.py:", p, file=sys.stderr)
    if problems:
        sys.exit(1)
    print(f"check_spack_recipe.py: ok: {recipe.relative_to(kat_cmake_options.ROOT)} "
          f"(version {project}, {len(defaults)} variants, {len(deps)} dependencies, "
          f"{len(combos)} variant combinations)")


if __name__ == "__main__":
    main()
