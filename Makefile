# mmevo: `make demo` trains and evaluates the embedded detector, `make test` runs the tests.
# Each target sets the environment up first (idempotent, seconds when already done).
PY := .venv/bin/python
export OMP_NUM_THREADS ?= 2
# libgomp spin-waits by default: with 2 cores shared by dataloader workers that
# costs up to 10x per training step (measured on the demo).
export OMP_WAIT_POLICY ?= PASSIVE

.PHONY: install demo demo-seg test clean

install:
	@bash tools/setup_env.sh

demo: install
	$(PY) tools/train.py configs/demo/retinanet_rednet-tiny_synthetic-coco.py --work-dir work_dirs/demo

demo-seg: install
	$(PY) tools/train.py configs/demo/fpn_rednet-tiny_synthetic-cityscapes.py --work-dir work_dirs/demo-seg

test: install
	$(PY) -m pytest tests -q

clean:
	rm -rf build work_dirs mmevo/*.so
