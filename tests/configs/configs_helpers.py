"""Helpers of the config tests: which configs exist and how to load them.

(A plain module, not a conftest.py, so its name is unique in the suite.)
"""

import copy
import functools
from pathlib import Path

from mmengine.config import Config

ROOT = Path(__file__).resolve().parents[2]
CONFIG_DIR = ROOT / 'configs'


def all_configs(classification=False):
    """Every detection and segmentation config under ``configs/`` (with
    ``classification``: every ImageNet one, ``*_in1k.py``), except the demo
    configs and ``_base_`` fragments, as paths relative to the repository
    root (sorted)."""
    paths = []
    for path in sorted(CONFIG_DIR.rglob('*.py')):
        rel = path.relative_to(CONFIG_DIR)
        # The Swin families have AdamW recipes of their own, outside the
        # SGD table of these tests.
        if (
            rel.parts[0] in ('demo', 'elsa_swin', 'acmix_swin')
            or '_base_' in rel.parts
        ):
            continue
        if path.name.endswith('_in1k.py') == classification:
            paths.append(str(path.relative_to(ROOT)))
    return paths


@functools.cache
def _load_cached(rel_path):
    return Config.fromfile(str(ROOT / rel_path))


def load(rel_path):
    """A fresh copy of the merged config of ``rel_path`` (relative to the
    repository root); merging the bases is done once per file."""
    return copy.deepcopy(_load_cached(rel_path))
