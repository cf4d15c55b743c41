#!/usr/bin/env bash
# Put the pure-Python wheels the GPU check needs on a bare CUDA machine
# (torch, torchvision, triton, numpy, opencv there; no network) into .whl/;
# run it where there is network. mmengine 0.10.7 and mmcv 2.1.0 built
# without its compiled ops, so that `mmevo.layers` (mmengine + mmcv.cnn)
# imports there, with the deps of the two a bare machine lacks; and pytest
# with its own, used only where the machine has no pytest. Not mmdet: its
# models need mmcv's compiled ops (the train-step timing builds torchvision's
# ResNet there). tools/analysis/gpu_check.sh installs them into a temporary
# folder.
# Usage: bash tools/analysis/gpu_wheels.sh   (PY=python with pip to override)
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PY:-python3}
DEST=.whl
rm -rf "$DEST" && mkdir -p "$DEST"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# Target: CPython 3.12 on x86-64 Linux; only pure wheels are expected.
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux2014_x86_64 -d "$DEST" \
    mmengine==0.10.7 addict termcolor yapf platformdirs pytest pluggy iniconfig

# mmcv ships only an sdist for our torch; built without ops it is pure
# Python. Its setup.py imports pkg_resources (setuptools < 70), so it builds
# in a throwaway venv that has just that.
"$PY" -m venv "$tmp/venv"
"$tmp/venv/bin/python" -m pip install -q 'setuptools<70' wheel
"$tmp/venv/bin/python" -m pip download -q --no-deps --no-binary=:all: \
    --no-build-isolation -d "$tmp" mmcv==2.1.0
MMCV_WITH_OPS=0 "$tmp/venv/bin/python" -m pip wheel -q --no-deps \
    --no-build-isolation -w "$DEST" "$tmp"/mmcv-2.1.0.tar.gz

status=0
for whl in "$DEST"/*.whl; do
    case "$whl" in
        *-none-any.whl) ;;
        *) echo "not a pure-Python wheel: $whl" >&2; status=1 ;;
    esac
done
ls -l "$DEST"
du -sh "$DEST"
exit $status
