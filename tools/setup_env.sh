#!/usr/bin/env bash
# One idempotent setup: .venv/ with the pinned stack and mmevo in editable mode.
# A second run only compares a stamp and returns in a second.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
PY=${PYTHON:-python3.11}
VENV=$ROOT/.venv
CACHE=${MMEVO_CACHE:-$HOME/.cache/mmevo}
STAMP=$VENV/.mmevo-setup-stamp

# The pinned stack (see README, "Version matrix").
MMCV_VERSION=2.1.0
# setuptools: torch wants >=77; mmengine resolves `mmdet::` config bases through
# pkg_resources, which setuptools 81 removed.
PINS=(torch==2.14.1 torchvision==0.29.1 mmengine==0.10.7 mmdet==3.3.0
      mmsegmentation==1.2.2 mmpretrain==1.2.0 "numpy<2" "opencv-python<4.11"
      ftfy regex pytest pycocotools
      # `make test` runs the tests in a process a core
      pytest-xdist==3.8.0
      grad-cam==1.4.8  # mmpretrain's vis_cam.py (passes use_cuda, gone in 1.5)
      "setuptools>=77,<81" wheel ninja
      # deployment (`pip install mmevo[deploy]`, tests/deployment)
      onnx==1.23.2 onnxruntime==1.31.1 onnxscript==0.7.2
      # packaging test (tests/test_packaging.py: python -m build --sdist)
      build==1.6.1
      # lint (`make lint`; .pre-commit-config.yaml uses the same version)
      ruff==0.17.6)
want=$( (echo "mmcv==$MMCV_VERSION"; printf '%s\n' "${PINS[@]}"; cat setup.py; find mmevo/ops/csrc -type f -print0 2>/dev/null |
         sort -z | xargs -0 -r cat) | sha1sum | cut -c1-16)
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want" ]; then
    echo "[setup] $VENV is up to date"
    exit 0
fi

[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
PIP=("$VENV/bin/python" -m pip)
# torch first: mmcv's build imports it. torch 2.14.1 is the CUDA build (it runs
# on the CPU too) and brings its own triton pin.
"${PIP[@]}" install -q torch==2.14.1 torchvision==0.29.1 "numpy<2" wheel ninja

# mmcv 2.1.0 has no wheel for torch 2.14: build it once with its ops, cache the wheel
# per torch build so the second setup (and CI) installs it in seconds.
TAG=$("$VENV/bin/python" -c 'import torch; print(torch.__version__.replace("+", "_"))')
mkdir -p "$CACHE/torch-$TAG"
if ! ls "$CACHE/torch-$TAG"/mmcv-$MMCV_VERSION-*.whl >/dev/null 2>&1; then
    echo "[setup] building mmcv $MMCV_VERSION with ops from source (about 11 min on 2 cores)"
    BUILD=$(mktemp -d)
    # mmcv 2.1.0's setup.py needs setuptools<70 (older than torch asks for; the
    # final install below restores a torch-compatible one).
    "${PIP[@]}" install -q "setuptools<70" addict packaging pyyaml yapf "opencv-python<4.11" pillow \
        2>&1 | grep -v 'requires setuptools>=' || true
    "${PIP[@]}" download -q --no-deps --no-build-isolation --no-binary :all: -d "$BUILD" "mmcv==$MMCV_VERSION"
    tar -xzf "$BUILD/mmcv-$MMCV_VERSION.tar.gz" -C "$BUILD"
    # torch >= 2.14's headers need C++20; mmcv 2.1.0 asks for C++17.
    sed -i 's/-std=c++17/-std=c++20/g' "$BUILD/mmcv-$MMCV_VERSION/setup.py"
    (cd "$BUILD/mmcv-$MMCV_VERSION" && MMCV_WITH_OPS=1 MAX_JOBS=${MAX_JOBS:-$(nproc)} \
        "${PIP[@]}" wheel -q --no-build-isolation --no-deps -w "$BUILD/dist" .)
    mv "$BUILD"/dist/mmcv-*.whl "$CACHE/torch-$TAG/"
    rm -rf "$BUILD"
fi
"${PIP[@]}" install -q "$CACHE/torch-$TAG"/mmcv-$MMCV_VERSION-*.whl "${PINS[@]}"
# mmevo itself, editable; builds the C++ CPU kernels. An extension left by an
# older build (another ABI tag) would be found first, so it goes.
rm -f mmevo/_ext*.so
"${PIP[@]}" install -q --no-build-isolation --no-deps -e .
"$VENV/bin/python" -c "import mmcv.ops, mmdet, mmseg, mmpretrain, mmevo; print('[setup] ok: torch', __import__('torch').__version__, 'mmcv', mmcv.__version__, 'mmdet', mmdet.__version__, 'mmseg', mmseg.__version__, 'mmpretrain', mmpretrain.__version__)"
echo "$want" > "$STAMP"
