#!/usr/bin/env bash
# Sparse-training benchmarks with kat_train (Serial backend), one CSV per run in
# build/bench-sparse-runs/. Parts:
#
#   scripts/bench_sparse.sh accuracy   test accuracy after KAT_SPARSE_EPOCHS epochs, dense
#                                      against RigL + ERK: the MLP at 90% and 95% sparsity,
#                                      the CNN at 90%
#   scripts/bench_sparse.sh agent      RigL and SET on the MLP at 90% sparsity, with and
#                                      without AGENT, seeds 0 1 2: accuracy per epoch, epochs
#                                      to KAT_SPARSE_TARGET, and the time AGENT adds per epoch
#
#   KAT_SPARSE_EPOCHS=10   epochs of every run
#   KAT_SPARSE_TARGET=0.85 the test accuracy "epochs to target" counts to (agent part)
#   KAT_SPARSE_MODELS="mlp cnn"   models of the accuracy part
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
part=${1:-}
case $part in accuracy | agent) ;; *)
  echo "usage: $0 accuracy|agent" >&2
  exit 2
  ;;
esac
"$root/scripts/setup.sh"
build=$root/build/bench-sparse
out=$root/build/bench-sparse-runs
mkdir -p "$build" "$out"
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DKAT_ENABLE_EXAMPLES=ON \
  >"$build/configure.log" 2>&1 || { cat "$build/configure.log"; exit 1; }
cmake --build "$build" --target kat_train -j "$(nproc)" >/dev/null
train=$build/examples/kat_train
epochs=${KAT_SPARSE_EPOCHS:-10}
echo "commit $(git -C "$root" rev-parse --short HEAD), $(date -u +%F), $(nproc) cores," \
  "Serial backend, $epochs epochs"

# run NAME FLAGS...: one kat_train run; prints its accuracies per epoch and its times.
run() {
  local name=$1
  shift
  "$train" --progress never --epochs "$epochs" --metrics "$out/$name.csv" "$@" >"$out/$name.log"
  awk -F, -v n="$name" '
    NR == 1 { for (i = 1; i <= NF; ++i) col[$i] = i; next }
    { acc = acc sprintf(" %.2f", 100 * $col["test_accuracy"]); wall += $col["wall_seconds"]
      if ("agent_refresh_s" in col) extra += $col["agent_refresh_s"]; last = $col["test_accuracy"] }
    END { printf "%-28s final %.2f%%  train %.1f s + refresh %.1f s  accuracy per epoch:%s\n",
          n, 100 * last, wall, extra, acc }' "$out/$name.csv"
}

if [ "$part" = accuracy ]; then
  for model in ${KAT_SPARSE_MODELS:-mlp cnn}; do
    run "$model-dense" --model "$model"
    sparsities="0.9 0.95"
    [ "$model" = cnn ] && sparsities="0.9"
    for s in $sparsities; do
      run "$model-rigl-erk-$s" --model "$model" --sparsity "$s" --sparse-method rigl \
        --sparse-init erk
    done
  done
  exit 0
fi

target=${KAT_SPARSE_TARGET:-0.85}
for method in rigl set; do
  for seed in 0 1 2; do
    for agent in off on; do
      flags=(--model mlp --sparsity 0.9 --sparse-method "$method" --seed "$seed")
      [ "$agent" = on ] && flags+=(--agent)
      run "mlp-$method-s$seed-agent-$agent" "${flags[@]}"
    done
  done
done
echo "epochs to $target test accuracy (- : not reached), per method and AGENT setting:"
for method in rigl set; do
  for agent in off on; do
    line=""
    for seed in 0 1 2; do
      e=$(awk -F, -v t="$target" 'NR == 1 { for (i = 1; i <= NF; ++i) col[$i] = i; next }
        !done && $col["test_accuracy"] >= t { print $col["epoch"]; done = 1 }
        END { if (!done) print "-" }' "$out/mlp-$method-s$seed-agent-$agent.csv")
      line="$line $e"
    done
    echo "  $method agent $agent:$line"
  done
done
