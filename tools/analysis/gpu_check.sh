#!/usr/bin/env bash
# One-command GPU check of mmevo (see tools/analysis/gpu_check.py): the ops
# and layers on CUDA against float64 references, then their speed; under
# 8 minutes on one H200. Without CUDA it runs the same checks small, on CPU
# tensors under TRITON_INTERPRET=1 (CI). Writes gpu_check.json / .md into
# $OUT if set, else into --out (default work_dirs/gpu_check); exits 1 on any
# mismatch.
# On a machine without mmcv / mmengine it installs the wheels of
# tools/analysis/gpu_wheels.sh (.whl/) into a temporary folder first.
# Usage: bash tools/analysis/gpu_check.sh [gpu_check.py options]
#        (PY=path/to/python to override; default .venv/bin/python or python3)
set -euo pipefail
cd "$(dirname "$0")/../.."
if [ -z "${PY:-}" ]; then
    if [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=python3; fi
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}

if ! "$PY" -c 'import mmcv.cnn, mmengine' 2>/dev/null; then
    if ! ls .whl/*.whl >/dev/null 2>&1; then
        echo 'gpu_check: mmcv / mmengine missing and no .whl/: run' \
            'tools/analysis/gpu_wheels.sh on a machine with network' >&2
        exit 1
    fi
    site=$(mktemp -d)
    trap 'rm -rf "$site"' EXIT
    # Pure-Python wheels are zip files: unpacked as they are without pip.
    "$PY" -m pip install -q --no-index --no-deps --no-compile \
        --target "$site" .whl/*.whl ||
        for whl in .whl/*.whl; do "$PY" -m zipfile -e "$whl" "$site"; done
    export PYTHONPATH=$PYTHONPATH:$site
fi

# Triton reads TRITON_INTERPRET when it is imported: decide before.
if ! "$PY" -c 'import sys, torch; sys.exit(not torch.cuda.is_available())'
then
    export TRITON_INTERPRET=1
fi
"$PY" tools/analysis/gpu_check.py "$@"
# On a GPU: the Triton kernels' registers / spills / shared memory for its
# compute capability (compiled ahead of time; CI compiles every target).
if [ -z "${TRITON_INTERPRET:-}" ]; then
    "$PY" tools/analysis/gpu_kernels.py --device --processes 8
fi
