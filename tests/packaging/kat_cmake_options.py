"""The variables a user may set when configuring KAT, read from its CMake files.

Shared by check_spack_recipe.py and check_presets.py: every -D option those emit must name one
of them, so a renamed or misspelled option fails the check instead of being silently ignored
by CMake (which only warns about unused variables).
"""
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[2]

# CMake's own variables that KAT's recipes and presets may set.
CMAKE_VARIABLES = {
    "CMAKE_BUILD_TYPE",
    "CMAKE_CXX_COMPILER",
    "CMAKE_CXX_FLAGS",
    "CMAKE_EXE_LINKER_FLAGS",
    "CMAKE_INSTALL_PREFIX",
    "CMAKE_PREFIX_PATH",
}


def cmake_files():
    files = [ROOT / "CMakeLists.txt"]
    files += sorted((ROOT / "cmake").glob("*.cmake"))
    for sub in ("tests", "examples", "bench"):
        f = ROOT / sub / "CMakeLists.txt"
        if f.exists():
            files.append(f)
    return files


def _strip_comments(text):
    return "\n".join(line.split("#", 1)[0] if not line.lstrip().startswith("#") else ""
                     for line in text.splitlines())


def options():
    """Returns (booleans, others): option() names, and the other settable names (cache
    variables that are not INTERNAL, variables the files test with `DEFINED`, <Pkg>_ROOT for
    every find_package'd Pkg, and CMAKE_VARIABLES)."""
    booleans, others = set(), set(CMAKE_VARIABLES)
    for f in cmake_files():
        text = _strip_comments(f.read_text())
        booleans.update(re.findall(r"\boption\(\s*(\w+)", text))
        for name, rest in re.findall(r"\bset\(\s*(\w+)\b([^)]*)\)", text, re.S):
            m = re.search(r"\bCACHE\s+(\w+)", rest)
            if m and m.group(1) != "INTERNAL":
                (booleans if m.group(1) == "BOOL" else others).add(name)
        others.update(re.findall(r"\bDEFINED\s+(\w+)", text))
        for pkg in re.findall(r"\b(?:find_package|find_dependency)\(\s*(\w+)", text):
            others.update({pkg + "_ROOT", pkg + "_DIR"})
    others -= booleans
    return booleans, others


def project_version():
    text = (ROOT / "CMakeLists.txt").read_text()
    m = re.search(r"\bproject\(\s*KAT\s+VERSION\s+([0-9]+\.[0-9]+\.[0-9]+)", text)
    if not m:
        raise SystemExit("CMakeLists.txt: no project(KAT VERSION X.Y.Z ...)")
    return m.group(1)


def check_definitions(where, definitions, booleans, others):
    """definitions: {name: value}. Returns a list of problems."""
    problems = []
    for name, value in definitions.items():
        if name in booleans:
            if str(value).upper() not in ("ON", "OFF", "TRUE", "FALSE", "1", "0"):
                problems.append(f"{where}: {name} is an option (ON/OFF), given '{value}'")
        elif name not in others:
            problems.append(f"{where}: -D{name} names no option or cache variable of KAT's "
                            "CMake files (CMakeLists.txt, cmake/, tests/, examples/, bench/)")
    return problems
