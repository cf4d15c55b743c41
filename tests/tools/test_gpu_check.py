"""tools/analysis/gpu_check.sh, the one-command GPU check, run small on the
CPU.

Without CUDA the script sets ``TRITON_INTERPRET=1`` before triton is
imported (hence a subprocess) and runs the selected ``cuda`` tests on CPU
tensors; the timings need CUDA and are not run. A failing test must make
it exit 1, and so must a run in which no test passed.
"""

import importlib.util
import json
import os
import os.path as osp
import subprocess
import sys

import pytest
import torch

pytestmark = pytest.mark.slow

REPO = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
SCRIPT = osp.join(REPO, 'tools', 'analysis', 'gpu_check.sh')
PLANTED = """
import pytest


@pytest.mark.cuda
def test_passes():
    assert 1 + 1 == 2


@pytest.mark.cuda
def test_planted_mismatch():
    assert abs(1.001 - 1.0) <= 1e-6


def test_not_a_cuda_test():
    raise AssertionError('deselected by -m cuda: never runs')
"""


def run_check(args, **env):
    """Run the one command; $OUT only if given in ``env``."""
    full = {k: v for k, v in os.environ.items() if k != 'OUT'}
    full.update(PY=sys.executable, **env)
    return subprocess.run(
        ['bash', SCRIPT, *args],
        cwd=REPO,
        env=full,
        capture_output=True,
        text=True,
        timeout=900,
    )


def load_gpu_check():
    spec = importlib.util.spec_from_file_location(
        'gpu_check', osp.join(REPO, 'tools', 'analysis', 'gpu_check.py')
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_gpu_check_passes_on_cpu(tmp_path):
    out = tmp_path / 'out'
    res = run_check(
        [
            '--out',
            str(out),
            '--',
            '-k',
            'second_derivatives or reruns or torch_backend[EvolutionConv] or '
            'compiles_fullgraph',
        ]
    )
    assert res.returncode == 0, res.stdout + res.stderr
    result = json.loads((out / 'gpu_check.json').read_text())
    assert result['passed'] and not result['reasons']
    outcomes = {t['id']: t['outcome'] for t in result['tests']}
    passed = sorted(
        i.split('::')[1].split('[')[0]
        for i, o in outcomes.items()
        if o == 'passed'
    )
    assert all(i.startswith('tests/') for i in outcomes)
    if not torch.cuda.is_available():
        # One geometry, fp32 and bf16, on the interpreter.
        assert passed == [
            'test_reruns_are_bit_identical',
            'test_reruns_are_bit_identical',
            'test_second_derivatives_match_reference',
            'test_triton_matches_torch_backend',
        ]
        assert result['meta']['device_kind'].startswith('cpu')
        # The CUDA-only test is reported skipped, the timings not run.
        assert list(outcomes.values()).count('skipped') == 1
        assert not result['benchmarks']
    md = (out / 'gpu_check.md').read_text()
    assert md.startswith('# GPU check: PASSED')
    assert 'tests/layers/test_layers_triton.py' in md


@pytest.mark.slow
def test_gpu_check_fails_on_a_failing_test(tmp_path):
    """A planted mismatch among the cuda tests: exit 1, reported, output
    in $OUT; the unmarked test does not run."""
    test = tmp_path / 'test_planted.py'
    test.write_text(PLANTED)
    out = tmp_path / 'out'
    res = run_check(['--tests', str(test), '--no-benchmarks'], OUT=str(out))
    assert res.returncode == 1, res.stdout + res.stderr
    result = json.loads((out / 'gpu_check.json').read_text())
    assert not result['passed']
    outcomes = {t['id'].split('::')[1]: t['outcome'] for t in result['tests']}
    assert outcomes == {
        'test_passes': 'passed',
        'test_planted_mismatch': 'failed',
    }
    assert len(result['reasons']) == 1
    assert 'test_planted_mismatch' in result['reasons'][0]
    assert (out / 'gpu_check.md').read_text().startswith('# GPU check: FAILED')


def test_verdict():
    gc = load_gpu_check()
    ok = dict(id='a.py::t', outcome='passed', seconds=1.0, message='')
    skip = dict(ok, id='a.py::s', outcome='skipped', message='needs CUDA')
    assert gc.verdict([ok, skip], 0, [], cuda=False) == []
    # On a GPU every cuda test runs: a skip fails the check.
    assert gc.verdict([ok, skip], 0, [], cuda=True) == [
        'skipped on CUDA: a.py::s (needs CUDA)'
    ]
    assert gc.verdict([], 5, [], cuda=False) == [
        'no test passed',
        'pytest exited with status 5',
    ]
    assert gc.verdict([skip], 0, [], cuda=False) == ['no test passed']
    bench = dict(name='train step', returncode=1)
    assert gc.verdict([ok], 0, [bench], cuda=True) == [
        'benchmark failed: train step (status 1)'
    ]
    # pytest failed although no test did (a collection error, say).
    assert gc.verdict([ok], 1, [], cuda=False) == [
        'pytest exited with status 1'
    ]


def test_cuda_test_files_are_the_marked_ones():
    gc = load_gpu_check()
    files = gc.cuda_test_files(REPO)
    assert 'tests/ops/test_triton_sweep.py' in files
    assert 'tests/layers/test_layers_triton.py' in files
    assert 'tests/ops/test_evolution_ops.py' not in files
