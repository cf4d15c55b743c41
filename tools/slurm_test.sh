#!/usr/bin/env bash
# Testing on a SLURM cluster, one task per GPU.
#   [GPUS=8] tools/slurm_test.sh PARTITION JOB_NAME CONFIG CHECKPOINT [test.py options]
# Env: GPUS (tasks, default 8), GPUS_PER_NODE (8), CPUS_PER_TASK (5), SRUN_ARGS
# (split on spaces: srun options).
set -x

PARTITION=$1
JOB_NAME=$2
CONFIG=$3
CHECKPOINT=$4
shift 4
GPUS=${GPUS:-8}
GPUS_PER_NODE=${GPUS_PER_NODE:-8}
CPUS_PER_TASK=${CPUS_PER_TASK:-5}
read -r -a SRUN_ARGS <<< "${SRUN_ARGS:-}"
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
PYTHON=${PYTHON:-$( [ -x "$ROOT/.venv/bin/python" ] && echo "$ROOT/.venv/bin/python" || echo python)}

PYTHONPATH="$ROOT":$PYTHONPATH \
srun -p "$PARTITION" \
    --job-name="$JOB_NAME" \
    --gres=gpu:"$GPUS_PER_NODE" \
    --ntasks="$GPUS" \
    --ntasks-per-node="$GPUS_PER_NODE" \
    --cpus-per-task="$CPUS_PER_TASK" \
    --kill-on-bad-exit=1 \
    "${SRUN_ARGS[@]}" \
    "$PYTHON" -u "$ROOT/tools/test.py" "$CONFIG" "$CHECKPOINT" --launcher=slurm "$@"
