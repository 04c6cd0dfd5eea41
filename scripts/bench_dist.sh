#!/usr/bin/env bash
# Distributed K-FAC benchmarks on this machine: kat_train (Serial backend, MPI) under mpiexec,
# --profile on, one CSV per run in build/bench-dist/. Two parts:
#
#   scripts/bench_dist.sh update   per second-order update: every step updates the factors and
#                                  the decompositions (--factor-update-steps 1
#                                  --inv-update-steps 1) for a few steps; bytes per update,
#                                  K-FAC memory per rank, second-order compute time per step
#   scripts/bench_dist.sh train    accuracy and time per epoch with the trainer's K-FAC
#                                  defaults (10/100), single rank against P ranks
#   scripts/bench_dist.sh dho2     DHO2 (fosi-momentum --dist-strategy dho2) against FOSI on
#                                  one rank: curvature memory per rank, bytes per step and the
#                                  refresh's time, over KAT_DIST_STEPS steps with a refresh
#                                  every 5 (k = 10, m = 40)
#   scripts/bench_dist.sh compare  the CNN at 4 ranks for KAT_DIST_EPOCHS epochs (default 6):
#                                  data-parallel SGD-momentum and Adam, K-FAC with KAISA and
#                                  DP-KFAC, DHO2 synchronous and with 2 curvature ranks (bound
#                                  0, which is synchronous on the overlapped runs' 2 training
#                                  ranks; eager; fixed at the bound T); time per epoch, test
#                                  accuracy, epochs and time to 91%, bytes per step and rank,
#                                  and DHO2's staleness, estimation and waiting time. Each at
#                                  the rate of the single-process CNN sweep (docs/benchmarks.md)
#
#   scripts/bench_dist.sh daso     the CNN at 4 ranks as 2 emulated nodes x 2 ranks
#                                  (--ranks-per-node 2) under an emulated inter-node link of
#                                  10 us and 1 GB/s, 100 us and 100 MB/s, and 1 ms and 20 MB/s, for
#                                  KAT_DIST_EPOCHS epochs (default 6): synchronous data-parallel
#                                  SGD-momentum against DASO (1 warm-up and 1 cool-down epoch,
#                                  the reference's schedule in between); time per epoch, bytes
#                                  over the link per epoch, test accuracy by epoch, DASO's skips
#
#   KAT_DIST_MODELS="mlp cnn"   models
#   KAT_DIST_RANKS="2 4"        rank counts
#   KAT_DIST_EPOCHS="2"         epochs of the train part
#   KAT_DIST_STEPS="10"         steps of the update and dho2 parts
#   KAT_DIST_REUSE=1            compare, daso: keep the CSVs of finished runs (to resume)
#
# Ranks use one thread each (ranks >= cores here); the single-rank runs use both cores.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
part=${1:-}
case $part in update | train | dho2 | compare | daso) ;; *)
  echo "usage: $0 update|train|dho2|compare|daso" >&2
  exit 2
  ;;
esac
"$root/scripts/setup.sh"
build=$root/build/bench-mpi
out=$root/build/bench-dist
mkdir -p "$build" "$out"
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DKAT_ENABLE_EXAMPLES=ON \
  -DKAT_ENABLE_MPI=ON >"$build/configure.log" 2>&1 || { cat "$build/configure.log"; exit 1; }
cmake --build "$build" --target kat_train -j "$(nproc)" >/dev/null
train=$build/examples/kat_train
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

models=${KAT_DIST_MODELS:-mlp cnn}
rank_counts=${KAT_DIST_RANKS:-2 4}
default_epochs=2
[ "$part" = compare ] || [ "$part" = daso ] && default_epochs=6
epochs=${KAT_DIST_EPOCHS:-$default_epochs}
steps=${KAT_DIST_STEPS:-10}

# run NAME RANKS ARGS...: kat_train on RANKS ranks (1: no mpiexec, both cores) into NAME.csv.
run() {
  local name=$1 ranks=$2
  shift 2
  local csv=$out/$name.csv
  if [ "$ranks" -eq 1 ]; then
    "$train" --progress never --profile --metrics "$csv" "$@" </dev/null >"$out/$name.txt" 2>&1
  else
    mpiexec --oversubscribe -n "$ranks" -x OMP_NUM_THREADS=1 -x OPENBLAS_NUM_THREADS=1 \
      "$train" --progress never --profile --metrics "$csv" "$@" </dev/null >"$out/$name.txt" 2>&1
  fi || { cat "$out/$name.txt" >&2; exit 1; }
}

# The strategies at P ranks: name and flags.
strategies() {
  local p=$1
  echo "dkfac --dist-strategy dkfac"
  echo "kaisa-comm-opt --dist-strategy kaisa --grad-worker-fraction 1"
  if [ "$p" -gt 2 ]; then
    echo "kaisa-hybrid-opt --dist-strategy kaisa --grad-worker-fraction 0.5"
  fi
  echo "kaisa-mem-opt --dist-strategy kaisa --grad-worker-fraction $(awk -v p="$p" 'BEGIN { print 1 / p }')"
  echo "dp-kfac --dist-strategy dp-kfac --dp-kfac-assignment round-robin"
  echo "dp-kfac-balanced --dist-strategy dp-kfac --dp-kfac-assignment balanced"
}

if [ "$part" = update ]; then
  printf '| model | ranks | strategy | bytes per second-order update | K-FAC state per rank, max / min (MB) | second-order compute per step, max rank (ms): factors + decomposition + precondition | communication (ms) |\n'
  printf '|---|---|---|---|---|---|---|\n'
  for model in $models; do
    for p in $rank_counts; do
      while read -r name flags; do
        tag=update-$model-$p-$name
        # shellcheck disable=SC2086
        run "$tag" "$p" --model "$model" --optimizer kfac $flags --epochs 1 \
          --train-subset $((steps * 128)) --factor-update-steps 1 --inv-update-steps 1
        csv=$out/$tag.csv
        awk -F, -v model="$model" -v p="$p" -v name="$name" '
          NR == 1 { for (i = 1; i <= NF; ++i) c[$i] = i; next }
          END {
            f = $c["factor_ms"]; d = $c["decomposition_ms"]; q = $c["precondition_ms"]
            printf "| %s | %d | %s | %.0f | %.2f / %.2f | %.1f + %.1f + %.1f = %.1f | %.1f |\n",
              model, p, name, $c["kfac_bytes_per_second_order_update"],
              $c["kfac_state_bytes_max"] / 1e6, $c["kfac_state_bytes_min"] / 1e6,
              f, d, q, f + d + q, $c["comm_ms"]
          }' "$csv"
      done < <(strategies "$p")
    done
  done
  exit 0
fi

if [ "$part" = dho2 ]; then
  printf '| model | ranks | run | curvature per rank (MiB) | × one rank | bytes per step | Lanczos per refresh (s) | projections per step (ms) |\n'
  printf '|---|---|---|---|---|---|---|---|\n'
  fosi=(--optimizer fosi-momentum --k 10 --warmup-w 5 --num-iters-to-approx-eigs 5 --epochs 1)
  for model in $models; do
    single=
    for p in 1 $rank_counts; do
      if [ "$p" -eq 1 ]; then
        name=fosi flags=()
      else
        name=dho2 flags=(--dist-strategy dho2)
      fi
      tag=dho2-$model-$p-$name
      run "$tag" "$p" --model "$model" "${fosi[@]}" "${flags[@]}" \
        --train-subset $((steps * 128))
      line=$(awk -F, 'NR == 1 { for (i = 1; i <= NF; ++i) c[$i] = i; next }
        END { print $c["fosi_curvature_bytes"], $c["fosi_bytes_per_step"], $c["fosi_lanczos_s"],
                    $c["fosi_projection_ms"] }' "$out/$tag.csv")
      read -r bytes per_step lanczos projection <<<"$line"
      [ -n "$single" ] || single=$bytes
      awk -v model="$model" -v p="$p" -v name="$name" -v b="$bytes" -v s="$single" \
        -v ps="$per_step" -v l="$lanczos" -v q="$projection" 'BEGIN {
          printf "| %s | %d | %s | %.2f | %.3f (1/P = %.3f) | %.0f | %.2f | %.2f |\n",
            model, p, name, b / 1048576, b / s, 1 / p, ps, l, q }'
    done
  done
  exit 0
fi

if [ "$part" = compare ]; then
  # name, optimizer flags: the global batch is 128 as on one process, so the single-process
  # CNN sweep's rates carry over (sgd 0.05, adam 0.002, fosi-momentum 0.02, kfac 0.05).
  p=4
  fosi=(--optimizer fosi-momentum --lr 0.02 --k 10 --dist-strategy dho2)
  runs=(
    "sgd --optimizer sgd --lr 0.05"
    "adam --optimizer adam --lr 0.002"
    "kaisa --optimizer kfac --lr 0.05 --dist-strategy kaisa --grad-worker-fraction 0.5"
    "dp-kfac --optimizer kfac --lr 0.05 --dist-strategy dp-kfac"
    "dho2 ${fosi[*]}"
    "dho2-overlap-s0 ${fosi[*]} --dho2-curvature-ranks 2 --dho2-staleness-bound 0"
    "dho2-overlap ${fosi[*]} --dho2-curvature-ranks 2"
    "dho2-overlap-fixed ${fosi[*]} --dho2-curvature-ranks 2 --dho2-swap fixed"
  )
  printf '| run | time per epoch (s) | test accuracy by epoch (%%) | epochs and training time to 91%% | bytes per step and rank | DHO2: staleness mean / max (steps), estimation / waited (s) |\n'
  printf '|---|---|---|---|---|---|\n'
  for entry in "${runs[@]}"; do
    read -r name flags <<<"$entry"
    tag=compare-cnn-$p-$name
    # KAT_DIST_REUSE=1 keeps a finished run's CSV (a run of all epochs) instead of rerunning it.
    if [ "${KAT_DIST_REUSE:-0}" != 1 ] || [ ! -f "$out/$tag.csv" ] ||
      [ "$(wc -l <"$out/$tag.csv")" -ne $((epochs + 1)) ]; then
      # shellcheck disable=SC2086 # the flags are words
      run "$tag" "$p" --model cnn --epochs "$epochs" --seed 0 $flags
    fi
    # Bytes per step on training rank 0: the gradient all-reduce plus K-FAC's or DHO2's own.
    awk -F, -v name="$name" -v target=0.91 '
      NR == 1 { for (i = 1; i <= NF; ++i) c[$i] = i; next }
      { wall += $2; n += 1; acc = acc (n > 1 ? ", " : "") sprintf("%.2f", 100 * $6)
        if (!hit && $6 >= target) { hit = 1; at = wall; e = $1 }
        fosi = ("fosi_bytes_per_step" in c) ? $c["fosi_bytes_per_step"] : 0
        bytes = $c["gradient_bytes_per_step"] + $c["kfac_bytes_per_step"] + fosi
        if ("fosi_staleness_mean" in c) {
          sm += $c["fosi_staleness_mean"] * 1; if ($c["fosi_staleness_max"] > smax) smax = $c["fosi_staleness_max"]
          est += $c["fosi_estimation_s"]; waited += $c["fosi_waited_s"]; stale = 1 } }
      END {
        reach = hit ? sprintf("%d, %.1f s", e, at) : sprintf("not in %d", n)
        extra = stale ? sprintf("%.1f / %d, %.1f / %.1f", sm / n, smax, est, waited) : ""
        printf "| %s | %.1f | %s | %s | %.0f | %s |\n", name, wall / n, acc, reach, bytes, extra
      }' "$out/$tag.csv"
  done
  exit 0
fi

if [ "$part" = daso ]; then
  p=4
  links=("fast 10e-6 1e9" "slow 100e-6 1e8" "slower 1e-3 2e7")
  runs=(
    "dp"
    "daso --dist-strategy daso --daso-warmup-epochs 1 --daso-cooldown-epochs 1"
  )
  printf '| link | run | time per epoch (s) | epoch times (s) | over the link per epoch (MB) | test accuracy by epoch (%%) | DASO skips by epoch |\n'
  printf '|---|---|---|---|---|---|---|\n'
  for link in "${links[@]}"; do
    read -r link_name latency bandwidth <<<"$link"
    for entry in "${runs[@]}"; do
      read -r name flags <<<"$entry"
      tag=daso-cnn-$p-$link_name-$name
      if [ "${KAT_DIST_REUSE:-0}" != 1 ] || [ ! -f "$out/$tag.csv" ] ||
        [ "$(wc -l <"$out/$tag.csv")" -ne $((epochs + 1)) ]; then
        # shellcheck disable=SC2086 # the flags are words
        run "$tag" "$p" --model cnn --optimizer sgd --lr 0.05 --epochs "$epochs" --seed 0 \
          --ranks-per-node 2 --emulate-internode-latency "$latency" \
          --emulate-internode-bandwidth "$bandwidth" $flags
      fi
      awk -F, -v link="$link_name ($latency s, $bandwidth B/s)" -v name="$name" '
        NR == 1 { for (i = 1; i <= NF; ++i) c[$i] = i; next }
        { wall += $2; n += 1; bytes += $c["internode_bytes"]
          acc = acc (n > 1 ? ", " : "") sprintf("%.2f", 100 * $6)
          times = times (n > 1 ? ", " : "") sprintf("%.1f", $2)
          if ("daso_global_skip" in c) {
            g = $c["daso_global_skip"]
            skips = skips (n > 1 ? ", " : "") (g == 0 ? "blocking" : g "/" $c["daso_local_skip"] "/" $c["daso_batches_to_wait"])
          } }
        END { printf "| %s | %s | %.1f | %s | %.1f | %s | %s |\n", link, name, wall / n, times,
                     bytes / n / 1e6, acc, skips }' "$out/$tag.csv"
    done
  done
  exit 0
fi

# train: the first epoch at or above the model's target, and the training time up to it.
printf '| model | ranks | run | time per epoch (s) | test accuracy by epoch (%%) | epochs and training time to target |\n'
printf '|---|---|---|---|---|---|\n'
summary() { # csv model ranks name
  local target=0.88
  [ "$2" = cnn ] && target=0.91
  awk -F, -v model="$2" -v p="$3" -v name="$4" -v target="$target" '
    NR == 1 { next }
    { wall += $2; n += 1; acc = acc (n > 1 ? ", " : "") sprintf("%.2f", 100 * $6)
      if (!hit && $6 >= target) { hit = 1; at = wall; e = $1 } }
    END {
      reach = hit ? sprintf("%d, %.1f s", e, at) : sprintf("not in %d", n)
      printf "| %s | %d | %s | %.1f | %s | %s |\n", model, p, name, wall / n, acc, reach
    }' "$1"
}
for model in $models; do
  run "train-$model-1-sgd" 1 --model "$model" --optimizer sgd --epochs "$epochs"
  summary "$out/train-$model-1-sgd.csv" "$model" 1 sgd
  run "train-$model-1-kfac" 1 --model "$model" --optimizer kfac --epochs "$epochs"
  summary "$out/train-$model-1-kfac.csv" "$model" 1 kfac
  for p in $rank_counts; do
    run "train-$model-$p-sgd" "$p" --model "$model" --optimizer sgd --epochs "$epochs"
    summary "$out/train-$model-$p-sgd.csv" "$model" "$p" sgd
    for name in dkfac dp-kfac kaisa-comm-opt; do
      flags=$(strategies "$p" | awk -v n="$name" '$1 == n { $1 = ""; print }')
      # shellcheck disable=SC2086
      run "train-$model-$p-$name" "$p" --model "$model" --optimizer kfac $flags --epochs "$epochs"
      summary "$out/train-$model-$p-$name.csv" "$model" "$p" "$name"
    done
  done
done
