#!/usr/bin/env python3
"""Checks CMakePresets.json against KAT's CMake files and scripts, without configuring:

  * format version 3 (what Debian 12's CMake 3.25 reads) and the presets the scripts' builds
    need: serial, openmp, cuda-sm80, cuda-sm90, hip-gfx90a, each with a build and a test preset;
  * every `inherits` and `configurePreset` names a configure preset;
  * every cache variable a configure preset sets (its own or inherited) is an option or cache
    variable of KAT's CMake files (tests/packaging/kat_cmake_options.py), options ON/OFF.

    python3 tests/packaging/check_presets.py [CMakePresets.json]
Exits 1 listing every problem. scripts/check_packaging.sh also runs `cmake --list-presets` and
configures the serial (and openmp) preset.
"""
import json
import pathlib
import sys

sys.dont_write_bytecode = True
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import kat_cmake_options  # noqa: E402

REQUIRED = ("serial", "openmp", "cuda-sm80", "cuda-sm90", "hip-gfx90a")


def main():
    path = pathlib.Path(sys.argv[1]) if len(sys.argv) > 1 else kat_cmake_options.ROOT / "CMakePresets.json"
    data = json.loads(path.read_text())
    problems = []
    if data.get("version") != 3:
        problems.append(f"{path.name}: version {data.get('version')}, expected 3 (CMake 3.21 to 3.25 read it)")
    configure = {p["name"]: p for p in data.get("configurePresets", [])}
    booleans, others = kat_cmake_options.options()

    def cache(name, seen=()):
        if name in seen:
            problems.append(f"{path.name}: configure preset '{name}' inherits itself")
            return {}
        preset = configure[name]
        merged = {}
        parents = preset.get("inherits", [])
        for parent in [parents] if isinstance(parents, str) else parents:
            if parent not in configure:
                problems.append(f"{path.name}: '{name}' inherits unknown preset '{parent}'")
                continue
            for k, v in cache(parent, seen + (name,)).items():
                merged.setdefault(k, v)  # the first parent wins, as in CMake
        merged.update(preset.get("cacheVariables", {}))
        return merged

    for name, preset in configure.items():
        if preset.get("hidden"):
            continue
        values = {k: (v["value"] if isinstance(v, dict) else v) for k, v in cache(name).items()}
        problems += kat_cmake_options.check_definitions(
            f"{path.name}: configure preset '{name}'", values, booleans, others)
    for kind in ("buildPresets", "testPresets"):
        presets = {p["name"]: p for p in data.get(kind, [])}
        for name, preset in presets.items():
            target = preset.get("configurePreset")
            if target is not None and target not in configure:
                problems.append(f"{path.name}: {kind} '{name}' names unknown configure preset '{target}'")
        for name in REQUIRED:
            if name not in presets or presets[name].get("configurePreset") != name:
                problems.append(f"{path.name}: no {kind[:-1]} '{name}' on configure preset '{name}'")
    for name in REQUIRED:
        if name not in configure or configure[name].get("hidden"):
            problems.append(f"{path.name}: no configure preset '{name}'")
    for p in problems:
        print("check_presets.py:", p, file=sys.stderr)
    if problems:
        sys.exit(1)
    print(f"check_presets.py: ok: {len(configure)} configure presets, every cache variable known")


if __name__ == "__main__":
    main()
