#!/usr/bin/env bash
# Distributed testing with torchrun.
#   tools/dist_test.sh CONFIG CHECKPOINT NUM_PROCS [test.py options]
# Without a GPU the processes run on the CPU over gloo (mmevo.integrations.mmengine).
CONFIG=$1
CHECKPOINT=$2
GPUS=$3
shift 3
NNODES=${NNODES:-1}
NODE_RANK=${NODE_RANK:-0}
PORT=${PORT:-29500}
MASTER_ADDR=${MASTER_ADDR:-"127.0.0.1"}
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
PYTHON=${PYTHON:-$( [ -x "$ROOT/.venv/bin/python" ] && echo "$ROOT/.venv/bin/python" || echo python)}

PYTHONPATH="$ROOT":$PYTHONPATH \
"$PYTHON" -m torch.distributed.run \
    --nnodes="$NNODES" \
    --node_rank="$NODE_RANK" \
    --master_addr="$MASTER_ADDR" \
    --nproc_per_node="$GPUS" \
    --master_port="$PORT" \
    "$ROOT/tools/test.py" \
    "$CONFIG" \
    "$CHECKPOINT" \
    --launcher pytorch "$@"
