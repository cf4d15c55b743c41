"""tools/analysis/gpu_check.sh, the one-command GPU check, run on the CPU.

Without CUDA it runs the Triton kernels through the interpreter
(``TRITON_INTERPRET=1``, set by the script before triton is imported, hence
a subprocess), on a small sweep; the CUDA-only sections are not run. A
planted mismatch must make it exit non-zero.
"""
import importlib.util
import json
import math
import os
import os.path as osp
import subprocess
import sys

import pytest
import torch

REPO = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
SCRIPT = osp.join(REPO, 'tools', 'analysis', 'gpu_check.sh')


def run_check(args, **env):
    """Run the one command; $OUT only if given in ``env``."""
    full = {k: v for k, v in os.environ.items() if k != 'OUT'}
    full.update(PY=sys.executable, **env)
    return subprocess.run(
        ['bash', SCRIPT] + args,
        cwd=REPO,
        env=full,
        capture_output=True,
        text=True,
        timeout=600)


def load_gpu_check():
    spec = importlib.util.spec_from_file_location(
        'gpu_check', osp.join(REPO, 'tools', 'analysis', 'gpu_check.py'))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_gpu_check_passes_on_cpu(tmp_path):
    out = tmp_path / 'out'
    res = run_check([
        '--out',
        str(out), '--geometries', '2', '--sections', 'ops', 'double',
        'determinism', 'layers', 'speed', '--layers', 'EvolutionConv',
        'LocalSelfAttention'
    ])
    assert res.returncode == 0, res.stdout + res.stderr
    result = json.loads((out / 'gpu_check.json').read_text())
    assert result['passed'] and not result['failures']
    by_section = {}
    for c in result['checks']:
        assert c['passed'] and c['worst'] <= c['tol'], c
        by_section.setdefault(c['section'], []).append(c)
    # 2 geometries x 3 dtypes x 3 ops; forward and every input gradient.
    assert len(by_section['ops']) == 18
    assert all(len(c['errors']) == 3 for c in by_section['ops'])
    assert {c['name'].split()[0]
            for c in by_section['double']
            } == {'aggregate', 'correlation', 'attention'}
    assert len(by_section['determinism']) == 1
    assert len(by_section['layers']) == 4  # float64 and bf16 autocast
    expected_device = 'cuda' if torch.cuda.is_available() else 'cpu'
    assert result['device_kind'].startswith(expected_device)
    if not torch.cuda.is_available():
        assert 'speed' not in by_section and not result['speed']
    md = (out / 'gpu_check.md').read_text()
    assert md.startswith('# GPU check: PASSED')


def test_gpu_check_fails_on_a_mismatch(tmp_path):
    """A planted error of 1e-3 in one result: exit 1, recorded as failed,
    and the output goes to $OUT."""
    out = tmp_path / 'out'
    res = run_check(['--sections', 'double'],
                    OUT=str(out),
                    MMEVO_GPU_CHECK_PERTURB='1e-3')
    assert res.returncode == 1, res.stdout + res.stderr
    result = json.loads((out / 'gpu_check.json').read_text())
    assert not result['passed']
    assert result['failures'] == ['aggregate second derivatives']
    assert (out / 'gpu_check.md').read_text().startswith('# GPU check: FAILED')


def test_rel_err_and_layer_errors():
    gc = load_gpu_check()
    ref = torch.tensor([1., -2., 4.], dtype=torch.float64)
    err = gc.rel_err(ref + torch.tensor([0., 0., 1e-3]), ref)
    assert err == pytest.approx(1e-3 / 4)
    assert gc.rel_err(torch.tensor([1., float('nan'), 4.]), ref) == math.inf
    assert gc.rel_err(ref[:2], ref) == math.inf
    zero = torch.zeros(2, dtype=torch.float64)
    assert gc.rel_err(torch.tensor([0., 1e-9]), zero) == pytest.approx(1e-9)
    # A tensor that is zero in theory is compared at 1% of the largest.
    got = {'out': ref.clone(), 'grad_b': torch.tensor([1e-5]), 'grad_c': None}
    refs = {'out': ref, 'grad_b': torch.tensor([1e-17]), 'grad_c': None}
    errs = gc.layer_errors(got, refs, 'max')
    assert errs == {'out': 0., 'grad_b': pytest.approx(1e-5 / 0.04)}
    got['grad_b'] = torch.tensor([1.])  # a real mismatch still shows
    assert gc.layer_errors(got, refs, 'max')['grad_b'] > 1
