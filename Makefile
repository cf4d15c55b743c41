# mmevo: `make demo` trains and evaluates the embedded detector, `make test` runs the tests.
# Each target sets the environment up first (idempotent, seconds when already done).
PY := .venv/bin/python
export OMP_NUM_THREADS ?= 2

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
