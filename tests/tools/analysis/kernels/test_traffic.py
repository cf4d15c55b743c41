"""The traffic model of the Triton kernels against the addresses they load.

Under ``TRITON_INTERPRET=1`` (in a subprocess: Triton reads it when
imported) each kernel runs with the tiles of the CUDA configs; the
interpreter's masked loads and stores are wrapped (here only) to collect
the distinct addresses each program touches per tensor, summed over the
programs. That sum must equal :mod:`tools.analysis.kernels.traffic`'s
``requested`` bytes, and the results must match the float64 reference.
"""

import json
import os
import subprocess
import sys

import pytest

from mmevo.ops.checks import Window
from tools.analysis.kernels import traffic

pytestmark = pytest.mark.slow

REPO = os.path.abspath(os.path.join(__file__, *['..'] * 5))

# (B, C, G, H, W, K, stride, padding, dilation, BLOCK_C, BLOCK_P)
CASES = [
    (1, 16, 1, 28, 28, 7, 1, 3, 1, 16, 128),  # a group of the shape
    (2, 40, 2, 13, 9, 3, 2, 1, 1, 16, 64),  # 20 channels: a partial chunk
    (1, 6, 3, 11, 70, 3, 1, 2, 2, 1, 256),  # two column blocks
    (1, 8, 1, 9, 5, 5, 3, 2, 1, 32, 512),  # stride 3, one tile
    (1, 4, 2, 1, 1, 1, 1, 0, 1, 4, 256),  # 1 x 1 maps
]

SCRIPT = r"""
import json, sys
import numpy as np
import torch
from triton.runtime import interpreter
from mmevo.ops import output_size, triton_backend as tb
from mmevo.ops.checks import Window
from mmevo.ops.reference import aggregate_reference, correlation_reference

builder = interpreter.interpreter_builder
touched = {}  # (kernel, program, tensor) -> arrays of byte addresses
ranges = {}


def wrap(method, mask_arg):
    def counted(*args):
        # (masks may come as int32)
        addr = args[0].data[args[mask_arg].data.astype(bool)]
        for name, (lo, hi) in ranges.items():
            sel = addr[(addr >= lo) & (addr < hi)]
            if sel.size:
                touched.setdefault((ranges_kernel[0], builder.grid_idx, name),
                                   []).append(sel)
        return method(*args)
    return counted


builder.create_masked_load = wrap(builder.create_masked_load, 1)
builder.create_masked_store = wrap(builder.create_masked_store, 2)
ranges_kernel = [None]


def hook(*args, **kwargs):  # the host tensors the kernel will address
    ranges.clear()
    for arg, t in zip(('a', 'b', 'out'), args[:3]):
        ranges[arg] = (t.data_ptr(), t.data_ptr() + t.nbytes)


for kernel in tb.KERNELS.values():
    kernel.fn.add_pre_run_hook(hook)


def run(name, a, b, out, G, K, in_hw, out_hw, s, p, d, bc, bp):
    kernel = tb.KERNELS[name]
    transpose = name == 'aggregate_transpose'
    scalars, consts = tb.launch_args(a, G, Window(K, s, p, d), in_hw,
                                     out_hw, transpose)

    ranges_kernel[0] = name
    grid = (tb.num_programs(a.shape[0], G, in_hw if transpose else out_hw,
                            scalars[10], consts['BLOCK_W'], bp), )
    kernel.fn[grid](a, b, out, *scalars, **consts, BLOCK_C=bc, BLOCK_P=bp)
    return out


B, C, G, H, W, K, s, p, d, bc, bp = json.loads(sys.argv[1])
Ho, Wo = output_size(H, K, s, p, d), output_size(W, K, s, p, d)
gen = torch.Generator().manual_seed(0)
x, gy = (torch.randn(B, C, *hw, generator=gen) for hw in ((H, W), (Ho, Wo)))
w = torch.randn(B, G, K, K, Ho, Wo, generator=gen)
xr, wr = (t.double().requires_grad_() for t in (x, w))
y_ref = aggregate_reference(xr, wr, Window(K, s, p, d, 'zeros'))
y_ref.backward(gy.double())
got = dict(
    y=run('aggregate', x, w, torch.empty_like(gy), G, K, (H, W), (Ho, Wo),
          s, p, d, bc, bp),
    gx=run('aggregate_transpose', gy, w, torch.empty_like(x), G, K, (H, W),
           (Ho, Wo), s, p, d, bc, bp),
    corr=run('correlate', gy, x, torch.empty_like(w), G, K, (H, W),
             (Ho, Wo), s, p, d, bc, bp))
ref = dict(y=y_ref, gx=xr.grad, corr=wr.grad)
err = {k: float((got[k].double() - ref[k]).abs().max()) for k in got}
sums = {}
for (kernel, _, tensor), addrs in touched.items():
    key = f'{kernel}.{tensor}'
    sums[key] = sums.get(key, 0) + len(np.unique(np.concatenate(addrs)))
print(json.dumps(dict(err=err, bytes=sums)))
"""

# The kernels' tensors (a, b, out) as the model names them.
NAMES = {
    'aggregate': ('x', 'w', 'y'),
    'aggregate_transpose': ('grad', 'w', 'grad_x'),
    'correlate': ('q', 'x', 'out'),
}


def measure(case):
    env = dict(os.environ, TRITON_INTERPRET='1', PYTHONPATH=REPO)
    out = subprocess.run(
        [sys.executable, '-c', SCRIPT, json.dumps(case)],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.splitlines()[-1])


@pytest.mark.parametrize('case', CASES)
def test_requested_bytes_match_the_loads(case):
    B, C, G, H, W, K, s, p, d, _bc, bp = case
    got = measure(case)
    for name, err in got['err'].items():  # the tile computes the op
        assert err <= 1e-4, (name, err)
    for kernel, names in NAMES.items():
        model = traffic.KERNELS[kernel](
            B, C, G, (H, W), Window(K, s, p, d), block_p=bp, itemsize=4
        )
        for arg, name in zip(('a', 'b', 'out'), names, strict=True):
            # one address per fp32 element
            assert (
                4 * got['bytes'].get(f'{kernel}.{arg}', 0)
                == model[name].requested
            ), (kernel, name)


def test_rednet_and_attention_shapes_within_2_5x():
    """The issue's bound on every operand, at the RedNet-50 stage shapes
    (16 channels a group) and ACmix-R50 stage 3's attention (4 heads of 64
    channels), for every CUDA tile."""
    shapes = [
        (64, 64, 4, 56),
        (64, 128, 8, 28),
        (64, 256, 16, 14),
        (64, 512, 32, 7),
        (64, 256, 4, 14),
    ]
    for B, C, G, H in shapes:
        for bp in (64, 128, 256, 512):
            for kernel, model in traffic.KERNELS.items():
                t = model(B, C, G, (H, H), Window(7, 1, 3, 1), bp, 2)
                for name, v in t.items():
                    assert v.l2 <= v.requested
                    assert v.requested <= 2.5 * v.minimal, (kernel, C, name)
