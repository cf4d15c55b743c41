#!/usr/bin/env bash
# One-command GPU check of mmevo (see tools/analysis/gpu_check.py): the
# suite's `cuda` tests on the GPU (pytest -m cuda), then the benchmark_*
# timings; about 8 minutes on one H200. Without CUDA the same tests run
# small, on CPU tensors under TRITON_INTERPRET=1 (CI). Writes gpu_check.json
# / .md into $OUT if set, else into --out (default work_dirs/gpu_check);
# exits 1 on any failure.
# On a machine without mmcv / mmengine (or pytest) it installs the
# wheels of tools/analysis/gpu_wheels.sh (.whl/) into a temporary folder.
# Usage: bash tools/analysis/gpu_check.sh [gpu_check.py options] [-- pytest args]
#        (PY=path/to/python to override; default .venv/bin/python or python3)
set -euo pipefail
cd "$(dirname "$0")/../.."
if [ -z "${PY:-}" ]; then
    if [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=python3; fi
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}

# The wheels of a group, only where the group does not import: the
# machine's own packages (its pytest plugins, say) stay in charge.
wheels=()
if ! "$PY" -c 'import mmcv.cnn, mmengine' 2>/dev/null; then
    for whl in .whl/*.whl; do
        case "$(basename "$whl")" in
            pytest-*|pluggy-*|iniconfig-*) ;;
            *) [ -e "$whl" ] && wheels+=("$whl") ;;
        esac
    done
    if [ ${#wheels[@]} -eq 0 ]; then
        echo 'gpu_check: mmcv / mmengine missing and no .whl/: run' \
            'tools/analysis/gpu_wheels.sh on a machine with network' >&2
        exit 1
    fi
fi
if ! "$PY" -c 'import pytest' 2>/dev/null; then
    wheels+=(.whl/pytest-*.whl .whl/pluggy-*.whl .whl/iniconfig-*.whl)
fi
if [ ${#wheels[@]} -gt 0 ]; then
    site=$(mktemp -d)
    trap 'rm -rf "$site"' EXIT
    "$PY" -m pip install -q --no-index --no-deps --no-compile \
        --target "$site" "${wheels[@]}"
    export PYTHONPATH=$PYTHONPATH:$site
fi

# Triton reads TRITON_INTERPRET when it is imported: decide before.
if ! "$PY" -c 'import sys, torch; sys.exit(not torch.cuda.is_available())'
then
    export TRITON_INTERPRET=1
fi
status=0
"$PY" tools/analysis/gpu_check.py "$@" || status=$?
# On a GPU: the Triton kernels' registers / spills / shared memory for its
# compute capability (compiled ahead of time; CI compiles every target).
if [ -z "${TRITON_INTERPRET:-}" ]; then
    "$PY" tools/analysis/gpu_kernels.py --device --processes 8 || status=1
fi
exit $status
