# mmevo: `make demo` trains and evaluates the embedded detector, `make test` runs the tests,
# `make lint` checks the code style (ruff: lint, imports, format; pyproject.toml), `make format` fixes it.
# Each target sets the environment up first (idempotent, seconds when already done).
PY := .venv/bin/python
export OMP_NUM_THREADS ?= 2
# libgomp spin-waits by default: with 2 cores shared by dataloader workers that
# costs up to 10x per training step (measured on the demo).
export OMP_WAIT_POLICY ?= PASSIVE

.PHONY: install demo demo-seg demo-cls deploy-demo test lint format gpu-check gpu-wheels \
	clean

LINT_PATHS := mmevo tools tests configs setup.py

install:
	@bash tools/setup_env.sh

demo: install
	$(PY) tools/misc/make_synthetic_data.py det --if-missing
	$(PY) tools/train.py configs/demo/retinanet_rednet26-tiny_fpn_1xb8-20e_synthetic-coco.py --work-dir work_dirs/demo

demo-seg: install
	$(PY) tools/misc/make_synthetic_data.py seg --if-missing
	$(PY) tools/train.py configs/demo/fpn_rednet26-tiny_1xb8-500iter_synthetic-cityscapes-128x256.py --work-dir work_dirs/demo-seg

# Trains and validates, then evaluates the last checkpoint again with
# tools/test.py (the same top-1 from the saved weights).
DEMO_CLS := configs/demo/rednet26-tiny_1xb32-warmup-coslr-30e_synthetic-imagenet-64px.py
demo-cls: install
	$(PY) tools/misc/make_synthetic_data.py cls --if-missing
	$(PY) tools/train.py $(DEMO_CLS) --work-dir work_dirs/demo-cls
	$(PY) tools/test.py $(DEMO_CLS) $$(cat work_dirs/demo-cls/last_checkpoint) --work-dir work_dirs/demo-cls-test

# Export the demo checkpoint (``make demo`` first) to ONNX and evaluate it
# with onnxruntime; compare with the PyTorch score of ``make demo``.
DEMO_CKPT ?= $(shell cat work_dirs/demo/last_checkpoint 2>/dev/null)
deploy-demo: install
	@test -n "$(DEMO_CKPT)" || { echo "error: no work_dirs/demo/last_checkpoint: run make demo first"; exit 1; }
	$(PY) tools/deployment/pytorch2onnx.py configs/demo/retinanet_rednet26-tiny_fpn_1xb8-20e_synthetic-coco.py $(DEMO_CKPT) --out work_dirs/demo/model.onnx --shape 128 128 --dynamic
	$(PY) tools/deployment/onnx_test.py configs/demo/retinanet_rednet26-tiny_fpn_1xb8-20e_synthetic-coco.py work_dirs/demo/model.onnx --work-dir work_dirs/demo-onnx

# pytest-xdist: a worker a core, at most 4 (each holds torch and the mm*
# stack, a few GB while it compiles a package); one OpenMP thread each and
# the 'two_cores' tests on one worker (tests/conftest.py). TEST_WORKERS=0
# runs the tests in one process. The budget: docs/install.md, "Tests".
TEST_WORKERS ?= $(shell n=$$(nproc); echo $$((n < 4 ? n : 4)))
test: install
	$(PY) -m pytest tests -q --durations=25 -n $(TEST_WORKERS) --dist loadgroup

lint: install
	.venv/bin/ruff check $(LINT_PATHS)
	.venv/bin/ruff format --check $(LINT_PATHS)

format: install
	.venv/bin/ruff check --fix $(LINT_PATHS)
	.venv/bin/ruff format $(LINT_PATHS)

# On a CUDA machine (TRITON_INTERPRET=1 on CPU tensors without one); see README.
gpu-check:
	bash tools/analysis/gpu_check.sh

# Where there is network: the pure-Python wheels gpu-check needs on a bare
# CUDA machine (no mmcv / mmengine), into .whl/.
gpu-wheels:
	bash tools/analysis/gpu_wheels.sh

clean:
	rm -rf build work_dirs mmevo/*.so
