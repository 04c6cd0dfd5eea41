#!/usr/bin/env bash
# Checks scripts/plot_metrics.py end to end on real kat_train output: two short runs (2 epochs
# on 512 training images; one writes --metrics as CSV, the other as JSON lines), one PNG of
# both, then the PNG itself: the PNG signature, the IHDR's width and height equal to the
# --size asked for, more than a minimum of bytes, and each run's line colour present in the
# pixels (a figure without curves fails). The same for scripts/plot_epoch_times.py's bars from
# docs/figures/kat_vs_pytorch_epoch_times.csv. Also checks that the scripts refuse a missing
# file, an empty file and a file without a needed column, with a message naming the file (and
# the column). Exits non-zero on any failure.
#
#   scripts/check_plots.sh [KAT_TRAIN [DATA_DIR]]
#   KAT_TRAIN     the kat_train binary (default: build/test-openmp/examples/kat_train, what
#                 scripts/test.sh builds)
#   DATA_DIR      Fashion-MNIST (default /usr/share/datasets/fashion-mnist)
#
# ctest runs it as plot_metrics (tests/CMakeLists.txt) in every configuration that builds
# kat_train; scripts/check_fresh_system.sh runs it on the bare system after scripts/train.sh.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
start=$SECONDS
train=${1:-${KAT_TRAIN:-$root/build/test-openmp/examples/kat_train}}
data=${2:-/usr/share/datasets/fashion-mnist}
# Debian's interpreter: python3-matplotlib lives in its dist-packages (scripts/setup.sh).
python=/usr/bin/python3
plot=$root/scripts/plot_metrics.py
fail() { echo "check_plots.sh: FAILED: $*" >&2; exit 1; }

[ -x "$train" ] || fail "KAT_TRAIN: expected an executable kat_train, got '$train' (build it with scripts/test.sh or scripts/train.sh, or pass its path)"
[ -d "$data" ] || fail "DATA_DIR: expected the Fashion-MNIST directory, got '$data' (scripts/setup.sh installs dataset-fashion-mnist)"
[ -x "$python" ] || fail "expected Debian's $python (scripts/setup.sh installs python3-matplotlib)"
"$python" -c 'import matplotlib' 2>/dev/null ||
  fail "$python cannot import matplotlib: run scripts/setup.sh (it installs python3-matplotlib)"

tmp=$(mktemp -d "${TMPDIR:-/tmp}/kat-check-plots.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

# Two short real runs. One thread (ctest runs tests side by side), no progress bar.
for run in sgd:csv adam:jsonl; do
  optimizer=${run%%:*}
  file=$tmp/$optimizer.${run##*:}
  OMP_NUM_THREADS=1 OMP_PROC_BIND=false "$train" --data-dir "$data" --model mlp --epochs 2 \
    --train-subset 512 --batch-size 64 --optimizer "$optimizer" --progress never \
    --metrics "$file" >"$tmp/$optimizer.log" 2>&1 ||
    { cat "$tmp/$optimizer.log" >&2; fail "kat_train --optimizer $optimizer exited non-zero"; }
  lines=$(grep -c . "$file" || true)
  want=$([ "${run##*:}" = csv ] && echo 3 || echo 2) # CSV: a header and 2 epochs
  [ "$lines" = "$want" ] || fail "$file: expected $want lines (2 epochs), got $lines"
done

# The figure, at a size whose IHDR is checked below.
width=640 height=480
"$python" "$plot" --out "$tmp/curves.png" --title "check_plots.sh" --size "${width}x${height}" \
  --dpi 80 "SGD=$tmp/sgd.csv" "$tmp/adam.jsonl" >"$tmp/plot.log" 2>&1 ||
  { cat "$tmp/plot.log" >&2; fail "plot_metrics.py exited non-zero"; }

# check_png FILE WIDTH HEIGHT LABEL:COLOUR...: the PNG signature, the IHDR (the first chunk:
# width and height as big-endian 32-bit integers at bytes 16..23; WIDTH 0: any size), a
# minimum size (an empty 640x480 canvas compresses to about 2 KB; a figure with its axes,
# text and curves is 30-50 KB), and at least 200 pixels of each run's colour (matplotlib's
# cycle colours C0, C1, ...: a figure without its curves or bars fails).
check_png() {
  "$python" - "$@" <<'EOF_PY' || fail "the PNG $1 is wrong (above)"
import struct, sys
path, width, height = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
runs = [a.split(":") for a in sys.argv[4:]]
with open(path, "rb") as f:
    data = f.read()
errors = []
if data[:8] != b"\x89PNG\r\n\x1a\n":
    errors.append(f"no PNG signature: the file starts with {data[:8]!r}")
elif data[12:16] != b"IHDR":
    errors.append(f"the first chunk is {data[12:16]!r}, expected b'IHDR'")
else:
    w, h = struct.unpack(">II", data[16:24])
    if width and (w, h) != (width, height):
        errors.append(f"IHDR says {w}x{h} pixels, expected {width}x{height} (--size)")
minimum = 10_000
if len(data) < minimum:
    errors.append(f"{len(data)} bytes, expected at least {minimum} (a figure with curves)")
if not errors:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.colors import to_rgb
    pixels = plt.imread(path)[:, :, :3]
    for label, color in runs:
        r, g, b = to_rgb(color)
        near = (abs(pixels[:, :, 0] - r) < 0.02) & (abs(pixels[:, :, 1] - g) < 0.02) & \
               (abs(pixels[:, :, 2] - b) < 0.02)
        if near.sum() < 200:
            errors.append(f"{label}: {int(near.sum())} pixels of its colour {color}, "
                          "expected at least 200 (its curves or bars)")
for e in errors:
    print(f"check_plots.sh: {path}: {e}", file=sys.stderr)
sys.exit(1 if errors else 0)
EOF_PY
}
check_png "$tmp/curves.png" "$width" "$height" "run SGD:C0" "run adam:C1"

# The bar chart of epoch times, from the CSV of docs/figures.
"$python" "$root/scripts/plot_epoch_times.py" "$root/docs/figures/kat_vs_pytorch_epoch_times.csv" \
  --out "$tmp/bars.png" >"$tmp/bars.log" 2>&1 ||
  { cat "$tmp/bars.log" >&2; fail "plot_epoch_times.py exited non-zero"; }
check_png "$tmp/bars.png" 0 0 "KAT bars:C0" "PyTorch bars:C1"

# Bad input: a clear error naming the file (and the column), exit status non-zero.
expect_error() { # expect_error WHAT TEXT FILE...: plot_metrics.py must fail with TEXT in its message
  local what=$1 text=$2
  shift 2
  if "$python" "$plot" --out "$tmp/bad.png" "$@" >"$tmp/bad.log" 2>&1; then
    fail "plot_metrics.py accepted $what"
  fi
  grep -qF -- "$text" "$tmp/bad.log" ||
    fail "plot_metrics.py on $what: expected '$text' in its message, got: $(cat "$tmp/bad.log")"
}
expect_error "a missing file" "'$tmp/missing.csv' does not exist" "$tmp/missing.csv"
: >"$tmp/empty.csv"
expect_error "an empty file" "'$tmp/empty.csv' is empty" "$tmp/empty.csv"
sed 's/test_accuracy/accuracy/' "$tmp/sgd.csv" >"$tmp/renamed.csv"
expect_error "a file without test_accuracy" "'$tmp/renamed.csv' has no column 'test_accuracy'" \
  "$tmp/renamed.csv"
expect_error "--extra with a column the files lack" "has no column 'density'" --extra density \
  "$tmp/sgd.csv"
"$python" "$root/scripts/plot_epoch_times.py" "$tmp/sgd.csv" --out "$tmp/bad.png" >"$tmp/bad.log" 2>&1 &&
  fail "plot_epoch_times.py accepted a metrics file as epoch times"
grep -qF "'$tmp/sgd.csv' has no column 'setting'" "$tmp/bad.log" ||
  fail "plot_epoch_times.py on a metrics file: expected a message naming the column 'setting', got: $(cat "$tmp/bad.log")"

echo "check_plots.sh: passed in $((SECONDS - start)) s ($(stat -c %s "$tmp/curves.png") bytes, ${width}x${height})"
