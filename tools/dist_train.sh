#!/usr/bin/env bash
# Distributed training on one or more machines with torchrun.
#   tools/dist_train.sh CONFIG NUM_PROCS [train.py options]
# Without a GPU the processes train on the CPU over gloo (mmevo.integrations.mmengine).
# Multi-node: NNODES, NODE_RANK, MASTER_ADDR, PORT as in mmdet.
CONFIG=$1
GPUS=$2
shift 2
NNODES=${NNODES:-1}
NODE_RANK=${NODE_RANK:-0}
PORT=${PORT:-29500}
MASTER_ADDR=${MASTER_ADDR:-"127.0.0.1"}
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
# the repo's .venv when there is one, else the python on PATH
PYTHON=${PYTHON:-$( [ -x "$ROOT/.venv/bin/python" ] && echo "$ROOT/.venv/bin/python" || echo python)}

PYTHONPATH="$ROOT":$PYTHONPATH \
"$PYTHON" -m torch.distributed.run \
    --nnodes="$NNODES" \
    --node_rank="$NODE_RANK" \
    --master_addr="$MASTER_ADDR" \
    --nproc_per_node="$GPUS" \
    --master_port="$PORT" \
    "$ROOT/tools/train.py" \
    "$CONFIG" \
    --launcher pytorch "$@"
