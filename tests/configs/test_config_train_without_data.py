"""The headline command stops with the one-line missing-data message."""

import os
import subprocess
import sys

import pytest

from configs_helpers import ROOT

pytestmark = pytest.mark.slow


def test_train_headline_config_without_coco(tmp_path):
    # Run from an empty directory: the config's relative data root
    # (data/coco/) is missing there whatever the developer has under ROOT.
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    out = subprocess.run(
        [
            sys.executable,
            str(ROOT / 'tools' / 'train.py'),
            str(ROOT / 'configs' / 'rednet50_fpn_coco.py'),
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode != 0
    lines = out.stderr.strip().splitlines()
    # One clear line, no traceback: which path, and where to read how to
    # get COCO.
    assert 'Traceback' not in out.stderr
    assert lines[-1].startswith('error: ')
    assert "'data/coco/' does not exist" in lines[-1]
    assert 'docs/datasets.md' in lines[-1]
    assert not (tmp_path / 'work_dirs').exists()  # stopped before the runner
