#!/usr/bin/env bash
# Builds KAT's API reference with Doxygen from the public headers' comments
# (docs/doxygen/Doxyfile: include/kat/ without namespace detail and the detail/ folders) into
# build/api/html/index.html, and fails (exit 1), printing them, if Doxygen warned: an
# undocumented public class, function or member, a @param naming no parameter, a broken
# reference. docs/api.md describes the reference and its conventions.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
command -v doxygen >/dev/null || { echo "api_docs.sh: doxygen is not installed; run scripts/setup.sh" >&2; exit 1; }
command -v dot >/dev/null || { echo "api_docs.sh: dot (graphviz) is not installed; run scripts/setup.sh" >&2; exit 1; }

# Headers whose warnings are printed but do not fail the check, as paths relative to the
# repository root (a folder stands for everything under it): a way to bring a new module in
# step by step. Empty: every public entity of include/kat/ is documented.
not_strict=()

out=build/api
log=$out/warnings.log
rm -rf "$out"
mkdir -p "$out"
start=$SECONDS
if ! doxygen docs/doxygen/Doxyfile >"$out/doxygen.log" 2>&1; then
  echo "api_docs.sh: doxygen failed; its output:" >&2
  cat "$out/doxygen.log" >&2
  exit 1
fi
[ -s "$out/html/index.html" ] || { echo "api_docs.sh: doxygen wrote no $out/html/index.html" >&2; exit 1; }
[ -f "$log" ] || { echo "api_docs.sh: doxygen wrote no warning log $log" >&2; exit 1; }

# A warning is a line "FILE:LINE: warning: ..." followed by its continuation lines (the list of
# undocumented parameters); split them into blocks, strict or not by FILE.
strict_log=$out/warnings-strict.log
lenient_log=$out/warnings-not-strict.log
awk -v root="$root/" -v prefixes="${not_strict[*]:-}" -v strict="$strict_log" -v lenient="$lenient_log" '
  BEGIN { n = split(prefixes, p, " "); printf "" > strict; printf "" > lenient; dest = strict }
  /^[^ ].*:[0-9]+: warning: / {
    file = $0; sub(/:[0-9]+: warning: .*/, "", file); sub("^" root, "", file)
    dest = strict
    for (i = 1; i <= n; ++i) if (index(file, p[i]) == 1) dest = lenient
  }
  { print > dest }
' "$log"
strict_count=$(grep -c ': warning: ' "$strict_log" || true)
lenient_count=$(grep -c ': warning: ' "$lenient_log" || true)
elapsed=$((SECONDS - start))
if ((lenient_count)); then
  echo "api_docs.sh: $lenient_count warnings in headers not yet held to the check (${not_strict[*]}):"
  sed "s|^$root/||" "$lenient_log"
fi
if ((strict_count)); then
  echo "api_docs.sh: $strict_count Doxygen warnings (document every public entity; see docs/api.md):" >&2
  sed "s|^$root/||" "$strict_log" >&2
  exit 1
fi
if ((lenient_count)); then
  echo "api_docs.sh: $out/html/index.html built in $elapsed s; no warning outside the $lenient_count above"
else
  echo "api_docs.sh: $out/html/index.html built in $elapsed s with no warning"
fi
