#!/usr/bin/env bash
# Runs a batch script of examples/slurm/ without Slurm, so that its kat_train command line
# cannot rot: `srun` becomes `mpiexec -n 2`, the run is cut to one epoch on 512 training
# images, and the metrics file the script names must appear with the --profile columns.
#   run_sbatch.sh SCRIPT BUILD_DIR DATA_DIR MPIEXEC [MPIEXEC_FLAGS...]
set -euo pipefail
script=$1 build=$2 data=$3
shift 3
launcher=("$@")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# The stand-in srun: drops srun's own options (--opt=value form), rewrites --epochs, adds
# --train-subset and starts two ranks.
{
  echo '#!/usr/bin/env bash'
  echo 'set -euo pipefail'
  printf 'launcher=('; printf '%q ' "${launcher[@]}"; echo ')'
  cat <<'INNER'
while [ $# -gt 0 ] && [[ $1 == --* ]]; do shift; done
program=$1
shift
args=()
while [ $# -gt 0 ]; do
  case $1 in
    --epochs) args+=(--epochs 1); shift 2 ;;
    *) args+=("$1"); shift ;;
  esac
done
exec "${launcher[@]}" -n 2 "$program" "${args[@]}" --train-subset 512
INNER
} >"$work/srun"
chmod +x "$work/srun"

cd "$work"
PATH="$work:$PATH" SLURM_NTASKS=2 SLURM_CPUS_PER_TASK=1 SLURM_JOB_ID=check \
  KAT_BUILD="$build" KAT_DATA="$data" bash "$script"

metrics=$work/kat-check.csv
if [ ! -s "$metrics" ]; then
  echo "run_sbatch.sh: $script wrote no metrics file kat-check.csv" >&2
  exit 1
fi
head -n 1 "$metrics" | grep -q 'kfac_bytes_per_step' ||
  { echo "run_sbatch.sh: no --profile columns in $(head -n 1 "$metrics")" >&2; exit 1; }
[ "$(wc -l <"$metrics")" -eq 2 ] ||
  { echo "run_sbatch.sh: expected a header and one epoch in the metrics file" >&2; cat "$metrics" >&2; exit 1; }
echo "run_sbatch.sh: $(basename "$script") ran"
