"""The traffic model of the Triton kernels against the addresses they load.

Under ``TRITON_INTERPRET=1`` (in a subprocess: Triton reads it when
imported) each kernel runs with the tiles of the CUDA configs (the fused
involution's with the interpreter's config and the tiles given; their
traffic depends on the tile and ``BLOCK_C`` alone); the
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
from mmevo.ops.fused_involution import same_window
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


def measure(case, script=SCRIPT):
    env = dict(os.environ, TRITON_INTERPRET='1', PYTHONPATH=REPO)
    out = subprocess.run(
        [sys.executable, '-c', script, json.dumps(case)],
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


# (B, C, G, C_r, H, W, K, stride, dilation, tile: None for tile_shape's)
FUSED_CASES = [
    (1, 12, 2, 3, 13, 11, 3, 1, 1, (5, 4)),  # 6 channels a group: 2 blocks
    (2, 6, 1, 17, 9, 12, 5, 2, 1, (2, 3)),  # stride 2, partial edge tiles
    (1, 4, 2, 2, 10, 9, 3, 2, 2, (2, 2)),  # stride and dilation 2
    (1, 4, 2, 65, 5, 6, 3, 1, 1, (3, 4)),  # C_r 65: two z-channel blocks
    (1, 4, 1, 1, 12, 12, 7, 1, 1, None),  # the default tiles: 2 x 2
]

FUSED_SCRIPT = r"""
import json, sys
import numpy as np
import torch
from triton.runtime import interpreter
from mmevo.ops import triton_fused as tf
from mmevo.ops.fused_involution import same_window
from mmevo.ops.reference import aggregate_reference, span_kernel

builder = interpreter.interpreter_builder
touched = {}  # (kernel, program, tensor) -> arrays of byte addresses
ranges = {}
current = [None]


def wrap(method, mask_arg):
    def counted(*args):
        addr = args[0].data[args[mask_arg].data.astype(bool)]
        for name, (lo, hi) in ranges.items():
            sel = addr[(addr >= lo) & (addr < hi)]
            if sel.size:
                key = (current[0], builder.grid_idx, name)
                touched.setdefault(key, []).append(sel)
        return method(*args)
    return counted


builder.create_masked_load = wrap(builder.create_masked_load, 1)
builder.create_masked_store = wrap(builder.create_masked_store, 2)
NAMES = dict(
    forward=('x', 'z', 's', 'bias', 'y'),
    backward=('grad', 'x', 'z', 's', 'bias', 'grad_x', 'grad_z', 'grad_s',
              'grad_b'),
)


def hooked(name):
    def hook(*args, **kwargs):  # the host tensors the kernel will address
        current[0] = name
        ranges.clear()
        for arg, t in zip(NAMES[name], args):
            ranges[arg] = (t.data_ptr(), t.data_ptr() + t.nbytes)
    return hook


for name, kernel in tf.KERNELS.items():
    kernel.fn.add_pre_run_hook(hooked(name))

B, C, G, Cr, H, W, K, s, d, tile = json.loads(sys.argv[1])
tile = tile and tuple(tile)
Ho, Wo = (H - 1) // s + 1, (W - 1) // s + 1
gen = torch.Generator().manual_seed(0)
shapes = [(B, C, H, W), (B, Cr, Ho, Wo), (G * K * K, Cr, 1, 1), (G * K * K,)]
x, z, S, b = (torch.randn(*sh, generator=gen) for sh in shapes)
gy = torch.randn(B, C, Ho, Wo, generator=gen)
leaves = [t.double().requires_grad_() for t in (x, z, S, b)]
y_ref = aggregate_reference(
    leaves[0], span_kernel(*leaves[1:], K, G), same_window(K, s, d))
y_ref.backward(gy.double())
y = tf.fused_involution_forward(x, z, S, b, K, s, d, G, tile)
grads = tf.fused_involution_backward(gy, x, z, S, b, K, s, d, G, tile)
err = {n: float((g.double() - r).abs().max()) for n, g, r in zip(
    ('y', 'x', 'z', 's', 'b'), (y, *grads),
    (y_ref, *(t.grad for t in leaves)))}
sums = {}
for (kernel, _, tensor), addrs in touched.items():
    key = f'{kernel}.{tensor}'
    sums[key] = sums.get(key, 0) + len(np.unique(np.concatenate(addrs)))
block_c = tf.CONFIGS['forward'][0].kwargs['BLOCK_C']
print(json.dumps(dict(err=err, bytes=sums, block_c=block_c)))
"""


@pytest.mark.parametrize('case', FUSED_CASES)
def test_fused_requested_bytes_match_the_loads(case):
    """The fused involution's forward and backward: the distinct addresses
    of every tensor (the backward's partials loaded and stored) summed
    over the programs are the model's ``requested`` bytes, and the
    results those of the float64 reference."""
    B, C, G, Cr, H, W, K, s, d, tile = case
    got = measure(case, FUSED_SCRIPT)
    for name, err in got['err'].items():
        assert err <= 1e-4, (name, err)
    tile = tile and tuple(tile)
    window = same_window(K, s, d)
    models = dict(
        forward=traffic.fused_forward(
            B, C, G, Cr, (H, W), window, got['block_c'], 4, tile
        ),
        backward=traffic.fused_backward(B, C, G, Cr, (H, W), window, 4, tile),
    )
    for kernel, model in models.items():
        for name, t in model.items():
            assert t.l2 <= t.requested
            measured = 4 * got['bytes'].get(f'{kernel}.{name}', 0)
            assert measured == t.requested, (kernel, name)


# RedNet-50's involutions, (C, G, C_r, H_in, stride, K): the stem (the
# ImageNet K 3 and the detection K 7), then each stage's stride-2 first
# layer and its stride-1 layers; 16 channels a group, C_r = C / 4.
REDNET50 = [
    (32, 2, 8, 112, 1, 3),
    (32, 2, 8, 112, 1, 7),
    (64, 4, 16, 56, 1, 7),
    (128, 8, 32, 56, 2, 7),
    (128, 8, 32, 28, 1, 7),
    (256, 16, 64, 28, 2, 7),
    (256, 16, 64, 14, 1, 7),
    (512, 32, 128, 14, 2, 7),
    (512, 32, 128, 7, 1, 7),
]


@pytest.mark.parametrize('batch', [1, 8, 64])
def test_fused_backward_reads_each_map_once_and_its_halo(batch):
    """At RedNet-50's shapes the fused backward requests each map-sized
    operand (grad_y, x, z, grad_x, grad_z) at most 1.5x its bytes, with no
    kernel map in the minimum; S, b and the partials, parameter-sized, are
    read (written) once per program, and S and b once from DRAM (l2). The
    forward's x and y too; its z is read once per (group, channel
    block)."""
    for C, G, Cr, H, s, K in REDNET50:
        window = same_window(K, s, 1)
        bwd = traffic.fused_backward(batch, C, G, Cr, (H, H), window, 2)
        for name in ('grad', 'x', 'z', 'grad_x', 'grad_z'):
            t = bwd[name]
            assert t.requested <= 1.5 * t.minimal, (C, H, s, K, name)
        for name in ('s', 'bias'):
            assert bwd[name].l2 == bwd[name].minimal
        fwd = traffic.fused_forward(batch, C, G, Cr, (H, H), window, 16, 2)
        for name in ('x', 'y'):
            assert fwd[name].requested <= 1.5 * fwd[name].minimal
        assert fwd['z'].requested == G * fwd['z'].minimal
