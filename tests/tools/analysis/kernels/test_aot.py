"""Every Triton kernel compiles to a GPU binary, without a GPU, and spills
nothing.

:mod:`tools.analysis.kernels.aot` compiles each kernel of
:mod:`mmevo.ops.triton_backend` for every CUDA config, dtype and target
(sm_80, sm_90, and sm_100 where the installed Triton has it) in two worker
processes with fresh Triton caches: about 4 minutes on 2 cores, seconds
when the kernels are those of an earlier run (its rows are kept in
``aot.CACHE``, ``~/.cache/mmevo/triton-aot``; ``MMEVO_CACHE``
moves it).
"""

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow

REPO = os.path.abspath(os.path.join(__file__, *['..'] * 5))
ENV = {k: v for k, v in os.environ.items() if k != 'TRITON_INTERPRET'}
ENV['PYTHONPATH'] = REPO


def python(*args, stdin=None):
    """Run Python without TRITON_INTERPRET (this process may have it)."""
    out = subprocess.run(
        [sys.executable, *args],
        input=stdin,
        env=ENV,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=3600,
    )
    assert out.returncode == 0, out.stderr[-4000:]
    return out.stdout


# two compiling processes: under xdist, on the worker of the other tests
# that keep both cores busy
@pytest.mark.xdist_group('two_cores')
def test_every_kernel_config_dtype_target_compiles_without_spills():
    """336 compiles of the evolution ops' kernels, 38 per target of the
    fused involution's and 48 per target of the fused local attention's
    (about 200 s and 35 s of CPU in two processes), unless cached (see the
    module's docstring)."""
    rows = json.loads(
        python(
            '-m', 'tools.analysis.kernels.aot', '--processes', '2', '--cache'
        )
    )
    meta = json.loads(
        python(
            '-c',
            'import json; from tools.analysis.kernels import aot as a; '
            'from mmevo.ops import triton_kernels as tk; '
            'from mmevo.ops.triton_fused import aot_jobs; '
            'from mmevo.ops import triton_fused_attention as fa; '
            'print(json.dumps([a.targets(), '
            'len(tk.GPU_CONFIGS), list(tk.KERNELS), '
            'len(aot_jobs(a.FUSED_DTYPES)), '
            'len(fa.aot_jobs(a.FUSED_DTYPES))]))',
        )
    )
    targets, n_configs, kernels, n_fused, n_attention = meta
    assert {80, 90} <= set(targets)
    # 3 kernels x 4 dtypes, and the correlation's fp32 logits of fp16 / bf16
    unfused = (len(kernels) * 4 + 2) * n_configs * len(targets)
    # the fused involution's forward and backward, and the fused local
    # attention's forward, grad_query and grad_kv
    fused_rows = (n_fused + n_attention) * len(targets)
    assert len(rows) == unfused + fused_rows
    fused = {'fused_forward', 'fused_backward'}
    fused |= {'attn_forward', 'attn_grad_query', 'attn_grad_kv'}
    assert {r['kernel'] for r in rows} == set(kernels) | fused
    errors = [r for r in rows if r['error']]
    assert not errors, errors[:3]
    spills = [r for r in rows if r['spill_bytes'] or r['local']]
    assert not spills, spills[:3]
    assert all(0 < r['regs'] <= 255 for r in rows)


CACHED = """
import json, sys
from tools.analysis.kernels import aot
job = dict(kernel='aggregate', dtype='fp16', out_dtype='fp16', config=0,
           target=90)
first = aot.run([job, dict(job, config=1)], cache=sys.argv[1])
again = aot.run(
    [job, dict(job, config=1), dict(job, block_w=64), dict(job, target=80),
     dict(job, kernel='correlate')],
    processes=1,
    cache=sys.argv[1],
)
print(json.dumps([first, again]))
"""


@pytest.mark.xdist_group('two_cores')
def test_cache_reuses_the_rows_of_the_same_compiles(tmp_path):
    """A compile's row comes back from the cache for the same kernel,
    config and target (the default column block given explicitly is the
    same compile), and another config, target or kernel compiles."""
    first, again = json.loads(python('-c', CACHED, str(tmp_path)))
    assert [r['cached'] for r in first] == [False, False]
    assert [r['cached'] for r in again] == [True, True, True, False, False]
    # the first two compiles of each run are the same jobs
    for fresh, cached in zip(first, again[:2], strict=True):
        assert cached == dict(fresh, cached=True)
    assert again[2] == dict(first[0], block_w=64, cached=True)
    assert all(r['error'] is None and r['regs'] for r in first + again)
    # one file a distinct compile
    assert len(list(tmp_path.iterdir())) == 4
