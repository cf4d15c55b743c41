"""Benchmark evolution aggregation: unfold reference vs pure PyTorch vs mmevo.

Times forward + backward (grad of input and kernel), round-robin, and measures
the peak memory of three implementations side by side, in one process, at the
RedNet-50 stage shapes (involution: K = 7, 16 channels per group):

* ``unfold``: the published involution code (``nn.Unfold`` of K^2 copies);
* ``shift``: the best pure-PyTorch formulation, shift-and-accumulate over the
  K^2 offsets (``mmevo.ops.torch_backend``): the mmevo ops with
  ``use_backend('torch')``, whose registered backward runs the transpose and
  the correlation on that backend too;
* ``mmevo``: ``mmevo.ops.evolution_aggregate`` (C++ on CPU, Triton on CUDA).

Peak memory is the largest number of bytes held by tensors allocated during
one forward + backward, above what was held before it (inputs excluded). On
CUDA it is ``torch.cuda.max_memory_allocated``; on CPU it is read from the
allocation/free records of the PyTorch profiler (``profile_memory=True``),
replayed in time order: every tensor byte torch allocates (the C++ kernels'
per-thread scratch rows, a few KiB, are plain std::vector and not counted).

``--inference`` times the forward alone instead, without gradients, at
batch 1 and the RedNet-50 stem (32 channels, 112²) and stage sizes, in the
two layouts mmevo's aggregation reads: NCHW, and channels-last as in an
AOTInductor package (the input, and the kernel map as a channels-last span
convolution leaves it); then, channels-last, the span convolution (C/4 ->
G*K*K) with that aggregation against ``mmevo::fused_involution``, which
computes the kernel from the reduced map and never writes it (what a
package runs with ``export_aoti(..., fused_involution=False)`` and by
default).

``--involution`` times one ``Involution`` layer at the RedNet-50 stem (32
channels, 112²) and stage shapes (K = 7, 16 channels per group, B8),
forward + backward of the input and every parameter, train mode: ``fused``
(the CPU fast path with ``mmevo::fused_involution``, taken at every shape
here; by default only at maps of ``FUSED_MIN_PIXELS`` or more),
``unfused`` (the fast path with the kernel map written, which a kernel hook
asks for), ``stock`` (the module graph, ``use_cpu_fastpath`` off), and
``conv3x3``, the 3×3 convolution it replaces in ResNet-50 (no bias).

``--attention`` times local self-attention at the ACmix-ResNet-50 /
LocalSelfAttention stage shapes (B8, C 64/128/256/512 at 56²/28²/14²/7²,
K = 7), forward + backward of query, key, value (and the relative
embedding): ``fused`` (``mmevo.ops.fused_local_attention``, the weights
never written) against ``stock`` (``local_attention_weights`` or
``local_correlation`` + ``window_softmax``, then ``evolution_aggregate``),
each with the pieces its layer adds: SASA (``LocalSelfAttention``: C/16
heads, the ``q . r`` relative embedding, zero padding) and ACmix (4 heads,
reflect padding, which the stock layer makes explicit with ``F.pad``).

``--conv1x1`` times a 1x1 convolution at ResNet-50's bottleneck widths and
the involution's generation widths (B4), forward + backward of the input
and the weight: PyTorch's ``conv2d`` (its native kernel on one thread,
oneDNN with more), mmevo's matmul (``pointwise``) and ``conv1x1``, which
the bottlenecks' fast path takes (in float32 oneDNN from 64 channels where
``MMEVO_CONV1X1`` says: by default on AMD CPUs, ``onednn`` on any).

``--conv1x1-inference`` times the forward alone of those 1x1 convolutions,
without gradients, at batch 1 and 4: oneDNN's (``_onednn_conv1x1``),
mmevo's matmul and ``conv1x1``, which in inference takes the matmul
below ``INFERENCE_ONEDNN_MIN_FMAS`` multiply-adds or
``INFERENCE_ONEDNN_MIN_IN_CHANNELS`` input channels
(``mmevo.layers.fastpath``).

``--acmix-conv`` times ACmix's conv path, the grouped 3x3 convolution of
its channels-last q/k/v buffer (head_dim groups of 12 -> 4 channels), at
every ACmix-ResNet-50 layer shape (B4, the stride-2 layers at their input
resolution), forward alone and forward + backward of the input and the
weight: ``onednn`` (``F.conv2d`` of the channels-last buffer, which
PyTorch runs on oneDNN) against ``mmevo`` (``mmevo::acmix_conv`` and its
backward, which ACmix's CPU fast path takes).

``--batch-norm`` times a training ``nn.BatchNorm2d`` at the NCHW maps of
ResNet-50's bottlenecks and RedNet-50's stem (B4), the forward alone and
forward + backward of the input, weight and bias: ``aten`` (the module)
against ``mmevo`` (``mmevo.layers.fastpath.batch_norm``, which the
backbones' CPU fast paths take; the same backward); then forward +
backward of the BN and the ReLU after it, and of the BN, a residual added
to it and the ReLU (a bottleneck's end), which ``batch_norm`` runs in its
pass.

``--avg-pool`` times a strided involution's average pool (2x2, stride 2)
at RedNet-50's strided maps (B4), forward alone and forward + backward of
the input: ``aten`` (the ``nn.AvgPool2d`` module) against ``mmevo``
(``mmevo.layers.fastpath.avg_pool``, oneDNN's depthwise convolution by
1/4, which the involution's CPU fast path takes).

Example:
    OMP_NUM_THREADS=2 python tools/analysis/benchmark_ops.py
    # on a busy machine:
    OMP_NUM_THREADS=1 python tools/analysis/benchmark_ops.py --cpu-time
    OMP_NUM_THREADS=1 python tools/analysis/benchmark_ops.py --inference \
        --cpu-time
    OMP_NUM_THREADS=1 python tools/analysis/benchmark_ops.py --involution \
        --cpu-time --repeat 9
    OMP_NUM_THREADS=1 python tools/analysis/benchmark_ops.py --attention \
        --cpu-time --repeat 3
    OMP_NUM_THREADS=1 python tools/analysis/benchmark_ops.py --conv1x1 \
        --cpu-time --repeat 9
    OMP_NUM_THREADS=2 python tools/analysis/benchmark_ops.py \
        --conv1x1-inference --repeat 15
    OMP_NUM_THREADS=1 python tools/analysis/benchmark_ops.py --acmix-conv \
        --cpu-time --repeat 9
    OMP_NUM_THREADS=1 python tools/analysis/benchmark_ops.py --batch-norm \
        --cpu-time --repeat 9
    python tools/analysis/benchmark_ops.py --device cuda --dtype float16
"""

import argparse
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from mmevo.cli import device_arg, int_in_range
from mmevo.ops import (
    evolution_aggregate,
    fused_involution,
    fused_local_attention,
    local_attention_weights,
    local_correlation,
    use_backend,
    window_softmax,
)

# run as a file: the repository root, for tools.analysis
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tools.analysis.timing import median_times, peak_bytes

# (B, C, H, G) of the four RedNet-50 stages; K = 7, stride 1, "same" padding.
STAGES = [(8, 64, 56, 4), (8, 128, 28, 8), (8, 256, 14, 16), (8, 512, 7, 32)]
# --inference: the stem involution of the detection RedNet-50, then the stages.
INFERENCE_SHAPES = [(1, 32, 112, 2)] + [(1, C, H, G) for _, C, H, G in STAGES]
# --involution: the stem involution of the detection RedNet-50, the stages.
LAYER_SHAPES = [(8, 32, 112, 2), *STAGES]
K = 7
# Peak DRAM bandwidth (bytes/s) of GPUs we know, for the achieved fraction.
PEAK_BANDWIDTH = {'H200': 4.8e12, 'H100': 3.35e12, 'A100': 2.0e12}


def unfold_aggregate(x, w):
    """The published involution aggregation (``unfold`` then weighted sum)."""
    B, C, H, W = x.shape
    G = w.shape[1]
    cols = torch.nn.functional.unfold(x, K, 1, (K - 1) // 2, 1)
    cols = cols.view(B, G, C // G, K * K, H, W)
    return (w.view(B, G, 1, K * K, H, W) * cols).sum(dim=3).view(B, C, H, W)


def mmevo_aggregate(x, w):
    return evolution_aggregate(x, w)


# name -> (function, backend of the mmevo ops during forward *and* backward).
IMPLS = {
    'unfold': (unfold_aggregate, 'auto'),
    'shift': (mmevo_aggregate, 'torch'),
    'mmevo': (mmevo_aggregate, 'auto'),
}


def fwd_bwd(impl, x, w, gy):
    fn, backend = impl
    with use_backend(backend):  # the backward calls the ops too
        fn(x, w).backward(gy)


def reset_grads(*tensors):
    for t in tensors:
        t.grad = None


def time_ms(steps, device, repeat, clock=time.perf_counter):
    """Median time in milliseconds on ``clock`` of each of ``steps`` (a
    dict), round-robin after one warm-up round
    (:func:`tools.analysis.timing.median_times`)."""
    times = median_times(steps, device, 1, repeat, clock)
    return {name: t * 1e3 for name, t in times.items()}


def forward_bandwidth(fn, x, w, device, repeat):
    """Bytes of the unavoidable forward traffic (read x, w; write y) per
    second."""
    with torch.no_grad():
        ms = time_ms({'fwd': lambda: fn(x, w)}, device, repeat)['fwd']
    nbytes = (2 * x.numel() + w.numel()) * x.element_size()
    return nbytes / (ms * 1e-3), ms


def _inference_steps(B, C, H, G, device, dtype):
    """The forwards :func:`inference_layouts` times at one shape."""
    x = torch.randn(B, C, H, H, device=device, dtype=dtype)
    k = torch.randn(B, G * K * K, H, H, device=device, dtype=dtype) / K
    z = torch.randn(B, C // 4, H, H, device=device, dtype=dtype)
    span = torch.nn.Conv2d(C // 4, G * K * K, 1).to(device, dtype)
    cl = torch.channels_last
    x_cl, z_cl = x.to(memory_format=cl), z.to(memory_format=cl)
    inputs = {
        'nchw': (x, k.view(B, G, K, K, H, H)),
        'cl': (x_cl, k.to(memory_format=cl).view(B, G, K, K, H, H)),
    }
    steps = {
        name: lambda a=a: evolution_aggregate(*a, padding=K // 2)
        for name, a in inputs.items()
    }

    def unfused():
        kernel = F.conv2d(z_cl, span.weight, span.bias)
        kernel = kernel.view(B, G, K, K, H, H)
        return evolution_aggregate(x_cl, kernel, padding=K // 2)

    steps['unfused'] = unfused
    steps['fused'] = lambda: fused_involution(
        x_cl, z_cl, span.weight, span.bias, K, 1, 1, G
    )
    return steps


def inference_layouts(device, dtype, repeat, clock):
    """Forward times of ``evolution_aggregate`` in NCHW and channels-last,
    and channels-last of the span convolution and aggregation against the
    fused op, at :data:`INFERENCE_SHAPES`."""
    print(
        '| shape (B·C·H²·K·G) | NCHW ms | channels-last ms | '
        'channels-last / NCHW | span + aggregation ms | fused ms | '
        'fused / span + aggregation |\n|---|---|---|---|---|---|---|'
    )
    for B, C, H, G in INFERENCE_SHAPES:
        steps = _inference_steps(B, C, H, G, device, dtype)
        with torch.no_grad():
            ms = time_ms(steps, device, repeat, clock)
        print(
            f'| {B}·{C}·{H}²·{K}·{G} | {ms["nchw"]:.3f} | {ms["cl"]:.3f} | '
            f'{ms["cl"] / ms["nchw"]:.2f} | {ms["unfused"]:.3f} | '
            f'{ms["fused"]:.3f} | {ms["fused"] / ms["unfused"]:.2f} |',
            flush=True,
        )


def involution_layers(device, dtype, repeat, clock):
    """Forward + backward of an Involution layer, fused and not, and of
    the 3×3 convolution it replaces, at the RedNet-50 stage shapes."""
    import mmevo.layers.involution as involution
    from mmevo.layers import Involution, set_cpu_fastpath

    # 'fused' is the fused op at every shape, the switch's threshold aside
    involution.FUSED_MIN_PIXELS = 0
    print(
        '| B·C·H²·K·G | path | ms | peak MiB | time / fused | '
        'memory / fused |\n|---|---|---|---|---|---|'
    )
    for B, C, H, G in LAYER_SHAPES:
        torch.manual_seed(0)
        x = torch.randn(
            B, C, H, H, device=device, dtype=dtype, requires_grad=True
        )
        gy = torch.randn(B, C, H, H, device=device, dtype=dtype)

        def build(C=C, G=G):
            return Involution(C, K, group_channels=C // G).to(device, dtype)

        hooked = build()
        hooked.register_kernel_hook(lambda module, kernel: None)
        modules = {
            'fused': build(),
            'unfused': hooked,
            'stock': set_cpu_fastpath(build(), False),
            'conv3x3': torch.nn.Conv2d(C, C, 3, padding=1, bias=False).to(
                device, dtype
            ),
        }

        def step(module, x=x, gy=gy):
            x.grad = None
            module.zero_grad(set_to_none=True)
            module(x).backward(gy)

        steps = {n: lambda m=m: step(m) for n, m in modules.items()}
        ms = time_ms(steps, device, repeat, clock)
        mib = {}
        for name, module in modules.items():
            # the last step's gradients freed outside the measured step
            x.grad = None
            module.zero_grad(set_to_none=True)
            mib[name] = peak_bytes(steps[name], device) / 2**20
        for name in modules:
            print(
                f'| {B}·{C}·{H}²·{K}·{G} | {name} | {ms[name]:.1f} | '
                f'{mib[name]:.1f} | {ms[name] / ms["fused"]:.2f}× | '
                f'{mib[name] / mib["fused"]:.2f}× |',
                flush=True,
            )


# (C_in, C_out, H) of ResNet-50's 1x1 convs (conv1, conv3, downsample) and
# of the involution's reduce / span convs at 14² and 7², B4; then the
# narrower generation convs at 56² and 28², which conv1x1 leaves to the
# matmul.
CONV1X1_SHAPES = [
    (256, 64, 56),
    (64, 256, 56),
    (512, 128, 28),
    (128, 512, 28),
    (1024, 256, 14),
    (256, 1024, 14),
    (2048, 512, 7),
    (512, 2048, 7),
    (256, 64, 14),
    (64, 784, 14),
    (512, 128, 7),
    (128, 1568, 7),
    (64, 16, 56),
    (16, 196, 56),
    (128, 32, 28),
    (32, 392, 28),
]


def conv1x1_inference_paths(device, dtype, repeat, clock):
    """The forward alone of a 1x1 convolution, without gradients, at
    :data:`CONV1X1_SHAPES` at batch 1 and 4: oneDNN's convolution (which
    re-lays out the weight on every call), mmevo's matmul and ``conv1x1``
    (the matmul for the small convs and those of few input channels, oneDNN
    for the others where ``MMEVO_CONV1X1`` takes it)."""
    from mmevo.layers import fastpath

    paths = {
        'onednn': fastpath._onednn_conv1x1,
        'matmul': fastpath.pointwise,
        'conv1x1': fastpath.conv1x1,
    }
    print(
        '| B·C_in·C_out·H² | pixels | onednn ms | matmul ms | conv1x1 ms | '
        'matmul / onednn | conv1x1 / onednn |\n|---|---|---|---|---|---|---|'
    )
    for B in (1, 4):
        for C, C_out, H in CONV1X1_SHAPES:
            x = torch.randn(B, C, H, H, device=device, dtype=dtype)
            w = torch.randn(C_out, C, 1, 1, device=device, dtype=dtype)
            with torch.no_grad():
                ms = time_ms(
                    {
                        n: lambda fn=fn, x=x, w=w: fn(x, w)
                        for n, fn in paths.items()
                    },
                    device,
                    repeat,
                    clock,
                )
            print(
                f'| {B}·{C}·{C_out}·{H}² | {B * H * H} | {ms["onednn"]:.3f} '
                f'| {ms["matmul"]:.3f} | {ms["conv1x1"]:.3f} '
                f'| {ms["matmul"] / ms["onednn"]:.2f} '
                f'| {ms["conv1x1"] / ms["onednn"]:.2f} |',
                flush=True,
            )


def conv1x1_paths(device, dtype, repeat, clock):
    """Forward + backward of a 1x1 convolution: PyTorch's ``conv2d`` (its
    own choice of kernel), mmevo's matmul (``pointwise``) and
    ``conv1x1`` (oneDNN where ``MMEVO_CONV1X1`` takes it), at
    :data:`CONV1X1_SHAPES`."""
    from mmevo.layers.fastpath import conv1x1, pointwise

    paths = {'conv2d': F.conv2d, 'matmul': pointwise, 'conv1x1': conv1x1}
    print(
        '| C_in·C_out·H² | conv2d ms | matmul ms | conv1x1 ms | '
        'conv1x1 / conv2d | conv1x1 / matmul |\n|---|---|---|---|---|---|'
    )
    for C, C_out, H in CONV1X1_SHAPES:
        x = torch.randn(
            4, C, H, H, device=device, dtype=dtype, requires_grad=True
        )
        w = torch.randn(
            C_out, C, 1, 1, device=device, dtype=dtype, requires_grad=True
        )
        gy = torch.randn(4, C_out, H, H, device=device, dtype=dtype)

        def step(fn, x=x, w=w, gy=gy):
            reset_grads(x, w)
            fn(x, w).backward(gy)

        ms = time_ms(
            {n: lambda fn=fn: step(fn) for n, fn in paths.items()},
            device,
            repeat,
            clock,
        )
        print(
            f'| {C}·{C_out}·{H}² | {ms["conv2d"]:.2f} | {ms["matmul"]:.2f} '
            f'| {ms["conv1x1"]:.2f} | {ms["conv1x1"] / ms["conv2d"]:.2f} '
            f'| {ms["conv1x1"] / ms["matmul"]:.2f} |',
            flush=True,
        )


# --acmix-conv: (C, H, stride) of ACmix-ResNet-50's layers, stride-2 ones at
# their input resolution.
ACMIX_CONV_SHAPES = [
    (64, 56, 1),
    (128, 56, 2),
    (128, 28, 1),
    (256, 28, 2),
    (256, 14, 1),
    (512, 14, 2),
    (512, 7, 1),
]


def acmix_conv_paths(device, dtype, repeat, clock):
    """ACmix's conv path at :data:`ACMIX_CONV_SHAPES`: oneDNN's grouped
    convolution of the channels-last buffer against ``mmevo::acmix_conv``
    (the same FLOPs; the buffer's channel order is each one's own), the
    forward alone and with the backward of the input and the weight."""
    ops = torch.ops.mmevo
    mask = [True, True, False]  # input and weight, no bias
    print(
        '| C·H²·stride | onednn fwd ms | mmevo fwd ms | onednn / mmevo fwd '
        '| onednn fwd+bwd ms | mmevo fwd+bwd ms | onednn / mmevo fwd+bwd |'
        '\n|---|---|---|---|---|---|---|'
    )
    for C, H, s in ACMIX_CONV_SHAPES:
        G = C // 4
        x = torch.randn(4, H, H, 3 * C, device=device, dtype=dtype)
        x = x.permute(0, 3, 1, 2)  # channels-last (4, 3C, H, H)
        w = torch.randn(C, 12, 3, 3, device=device, dtype=dtype)
        gy = torch.randn(4, C, (H - 1) // s + 1, (H - 1) // s + 1)
        gy = gy.to(device, dtype)

        def onednn(x=x, w=w, s=s, G=G):
            return F.conv2d(x, w, None, s, 1, 1, G)

        def onednn_step(x=x, w=w, s=s, G=G, gy=gy):
            onednn()
            torch.ops.aten.convolution_backward(
                gy, x, w, None, [s, s], [1, 1], [1, 1], False, [0, 0], G, mask
            )

        def mmevo(x=x, w=w, s=s, G=G):
            return ops.acmix_conv(x, w, G, s, 1)

        def mmevo_step(x=x, w=w, s=s, G=G, gy=gy):
            mmevo()
            ops.acmix_conv_backward(gy, x, w, G, s, 1, mask[:2])

        ms = time_ms(
            {
                'onednn': onednn,
                'mmevo': mmevo,
                'onednn_step': onednn_step,
                'mmevo_step': mmevo_step,
            },
            device,
            repeat,
            clock,
        )
        print(
            f'| {C}·{H}²·{s} | {ms["onednn"]:.2f} | {ms["mmevo"]:.2f} '
            f'| {ms["onednn"] / ms["mmevo"]:.2f}× '
            f'| {ms["onednn_step"]:.2f} | {ms["mmevo_step"]:.2f} '
            f'| {ms["onednn_step"] / ms["mmevo_step"]:.2f}× |',
            flush=True,
        )


def sasa_stock(q, k, v, rel, heads):
    """LocalSelfAttention's unfused path: the logits, ``q . r``, softmax,
    aggregation (zero padding)."""
    B, C, H, W = q.shape
    logits = local_correlation(q, k, heads, K)
    r = rel.view(heads, C // heads, K, K)
    logits = logits + torch.einsum(
        'bgdhw,gduv->bguvhw', q.view(B, heads, C // heads, H, W), r
    )
    return evolution_aggregate(v, window_softmax(logits))


def acmix_stock(q, k, v, rel, heads):
    """ACmix's attention branch: k and v reflection-padded by ``F.pad``,
    the fused correlation + softmax, the aggregation."""
    pad = (K // 2,) * 4
    F = torch.nn.functional
    kp, vp = F.pad(k, pad, mode='reflect'), F.pad(v, pad, mode='reflect')
    weights = local_attention_weights(q, kp, heads, K, padding=0)
    return evolution_aggregate(vp, weights, padding=0)


def sasa_fused(q, k, v, rel, heads):
    return fused_local_attention(q, k, v, heads, K, rel_embed=rel)


def acmix_fused(q, k, v, rel, heads):
    return fused_local_attention(q, k, v, heads, K, padding_mode='reflect')


# layer -> (heads of C channels, relative embedding, {path: function})
ATTENTION = {
    'SASA': (
        lambda C: C // 16,
        True,
        {'fused': sasa_fused, 'stock': sasa_stock},
    ),
    'ACmix': (
        lambda C: 4,
        False,
        {'fused': acmix_fused, 'stock': acmix_stock},
    ),
}


def attention_layers(device, dtype, repeat, clock):
    """Forward + backward of local self-attention, fused and stock, at the
    stage shapes of :data:`STAGES`, as SASA and ACmix run it."""
    print(
        '| layer | B·C·H²·K·heads | path | ms | peak MiB | time / fused | '
        'memory / fused |\n|---|---|---|---|---|---|---|'
    )
    for layer, (heads_of, with_rel, paths) in ATTENTION.items():
        for B, C, H, _ in STAGES:
            heads = heads_of(C)
            torch.manual_seed(0)

            def leaf(*shape, scale=1.0):
                t = torch.randn(*shape, device=device) * scale
                return t.to(dtype).requires_grad_()

            q = leaf(B, C, H, H, scale=(C // heads) ** -0.5)
            k, v = leaf(B, C, H, H), leaf(B, C, H, H)
            rel = leaf(C, K, K) if with_rel else None
            gy = torch.randn(B, C, H, H, device=device, dtype=dtype)
            leaves = [t for t in (q, k, v, rel) if t is not None]

            def step(fn, leaves=leaves, args=(q, k, v, rel, heads), gy=gy):
                reset_grads(*leaves)
                fn(*args).backward(gy)

            steps = {n: lambda fn=fn: step(fn) for n, fn in paths.items()}
            ms = time_ms(steps, device, repeat, clock)
            mib = {}
            for name, s in steps.items():
                reset_grads(*leaves)  # freed outside the measured step
                mib[name] = peak_bytes(s, device) / 2**20
            reset_grads(*leaves)
            for name in paths:
                print(
                    f'| {layer} | {B}·{C}·{H}²·{K}·{heads} | {name} | '
                    f'{ms[name]:.1f} | {mib[name]:.1f} | '
                    f'{ms[name] / ms["fused"]:.2f}× | '
                    f'{mib[name] / mib["fused"]:.2f}× |',
                    flush=True,
                )


def _positive_float(text):
    """An argparse ``type``: a float > 0 (a bandwidth divides)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f'expected a number, got {text!r}'
        ) from None
    if not value > 0:  # also refuses nan
        raise argparse.ArgumentTypeError(f'expected a number > 0, got {text}')
    return value


_positive_float.__name__ = 'float'  # argparse names the type in its message


# --batch-norm: (C, H) of the NCHW maps a BN normalises in ResNet-50's
# bottlenecks and RedNet-50's stem.
BATCH_NORM_SHAPES = [
    (32, 112),
    (64, 56),
    (256, 56),
    (128, 28),
    (512, 28),
    (256, 14),
    (1024, 14),
    (512, 7),
    (2048, 7),
]


def _forwards_and_steps(paths, forwards, forward, step):
    """The timed callables of a table: ``forward(fn)`` of the ``forwards``
    among ``paths`` under their names, ``step(fn)`` of every path as
    ``<name>_step``."""
    return {
        **{n: lambda fn=paths[n]: forward(fn) for n in forwards},
        **{f'{n}_step': lambda fn=fn: step(fn) for n, fn in paths.items()},
    }


def _print_ratio_row(label, ms, pairs):
    """A table row: ``label``, then per pair (a, b) of ``ms``'s names their
    times and a's over b's."""
    cells = [label]
    for a, b in pairs:
        cells += [f'{ms[a]:.2f}', f'{ms[b]:.2f}', f'{ms[a] / ms[b]:.2f}×']
    print('| ' + ' | '.join(cells) + ' |', flush=True)


def batch_norm_paths(device, dtype, repeat, clock):
    """A training ``nn.BatchNorm2d`` at :data:`BATCH_NORM_SHAPES`: the
    module (ATen's kernels) against ``fastpath.batch_norm``, the forward
    alone and with the backward of the input, weight and bias; then with
    the ReLU after it (a bottleneck's first two BNs), and with a residual
    added before the ReLU (its last), forward + backward of the residual
    too (the stock ``relu(bn(x))`` and ``relu(bn(x) + r)`` against
    ``batch_norm(x, bn, relu)`` and ``batch_norm(x, bn, relu, r)``)."""
    from torch import nn

    from mmevo.layers.fastpath import batch_norm

    print(
        '| C·H² | aten fwd ms | mmevo fwd ms | aten / mmevo fwd '
        '| aten fwd+bwd ms | mmevo fwd+bwd ms | aten / mmevo fwd+bwd '
        '| + ReLU: aten ms | mmevo ms | aten / mmevo '
        '| + residual + ReLU: aten ms | mmevo ms | aten / mmevo |'
        '\n|---|---|---|---|---|---|---|---|---|---|---|---|---|'
    )
    relu = nn.ReLU(inplace=True)
    for C, H in BATCH_NORM_SHAPES:
        bn = nn.BatchNorm2d(C).to(device, dtype)
        x, r, gy = (
            torch.randn(4, C, H, H, device=device, dtype=dtype)
            for _ in range(3)
        )
        x.requires_grad_()
        r.requires_grad_()
        paths = {
            'aten': lambda t, bn=bn: bn(t),
            'mmevo': batch_norm,
            'aten_relu': lambda t, bn=bn: relu(bn(t)),
            'mmevo_relu': lambda t, bn=bn: batch_norm(t, bn, relu),
            # the stock block's order: BN, shortcut added in place, ReLU
            'aten_res': lambda t, bn=bn, r=r: relu(bn(t).add_(r)),
            'mmevo_res': lambda t, bn=bn, r=r: batch_norm(t, bn, relu, r),
        }

        def forward(fn, x=x, bn=bn):
            with torch.no_grad():
                fn(x, bn)

        def step(fn, x=x, bn=bn, gy=gy, r=r):
            reset_grads(x, r, bn.weight, bn.bias)
            fn(x, bn).backward(gy)

        ms = time_ms(
            _forwards_and_steps(paths, ('aten', 'mmevo'), forward, step),
            device,
            repeat,
            clock,
        )
        _print_ratio_row(
            f'{C}·{H}²',
            ms,
            [
                ('aten', 'mmevo'),
                ('aten_step', 'mmevo_step'),
                ('aten_relu_step', 'mmevo_relu_step'),
                ('aten_res_step', 'mmevo_res_step'),
            ],
        )


# --avg-pool: (C, H) of the maps RedNet-50's strided involutions pool.
AVG_POOL_SHAPES = [(128, 56), (256, 28), (512, 14)]


def avg_pool_paths(device, dtype, repeat, clock):
    """An involution's ``nn.AvgPool2d(2, 2, ceil_mode=True)`` at
    :data:`AVG_POOL_SHAPES`: the module (ATen's kernel) against
    ``fastpath.avg_pool``, the forward alone and with the input's
    backward."""
    from torch import nn

    from mmevo.layers.fastpath import avg_pool

    print(
        '| C·H² | aten fwd ms | mmevo fwd ms | aten / mmevo fwd '
        '| aten fwd+bwd ms | mmevo fwd+bwd ms | aten / mmevo fwd+bwd |'
        '\n|---|---|---|---|---|---|---|'
    )
    pool = nn.AvgPool2d(2, 2, ceil_mode=True)
    paths = {'aten': pool, 'mmevo': lambda t: avg_pool(t, pool)}
    for C, H in AVG_POOL_SHAPES:
        x = torch.randn(4, C, H, H, device=device, dtype=dtype)
        x.requires_grad_()
        gy = torch.randn(4, C, H // 2, H // 2, device=device, dtype=dtype)

        def forward(fn, x=x):
            with torch.no_grad():
                fn(x)

        def step(fn, x=x, gy=gy):
            reset_grads(x)
            fn(x).backward(gy)

        ms = time_ms(
            _forwards_and_steps(paths, paths, forward, step),
            device,
            repeat,
            clock,
        )
        _print_ratio_row(
            f'{C}·{H}²', ms, [('aten', 'mmevo'), ('aten_step', 'mmevo_step')]
        )


def main():
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--device', type=device_arg, default='cpu')
    parser.add_argument(
        '--dtype',
        default='float32',
        choices=['float32', 'float64', 'float16', 'bfloat16'],
    )
    # the median of no timing is an error
    parser.add_argument('--repeat', type=int_in_range(1), default=5)
    parser.add_argument(
        '--impls', nargs='+', default=list(IMPLS), choices=list(IMPLS)
    )
    parser.add_argument(
        '--peak-gbps',
        type=_positive_float,
        default=None,
        help='peak memory bandwidth of the GPU in GB/s (known: '
        + ', '.join(PEAK_BANDWIDTH)
        + ')',
    )
    parser.add_argument(
        '--cpu-time',
        action='store_true',
        help='time with the process CPU clock instead of the wall clock: '
        'with OMP_NUM_THREADS=1 it ignores other processes on a busy '
        'machine',
    )
    parser.add_argument(
        '--inference',
        action='store_true',
        help='the forward alone, without gradients, at batch 1: NCHW '
        'against channels-last (as in an AOTInductor package)',
    )
    parser.add_argument(
        '--involution',
        action='store_true',
        help='an Involution layer, fused and unfused, and a 3x3 conv, '
        'forward + backward at the stage-1 shape',
    )
    parser.add_argument(
        '--attention',
        action='store_true',
        help='local self-attention (SASA and ACmix), fused and stock, '
        'forward + backward at the stage shapes',
    )
    parser.add_argument(
        '--conv1x1',
        action='store_true',
        help="a 1x1 conv, forward + backward: PyTorch's conv2d, mmevo's "
        'matmul and its conv1x1 (oneDNN where MMEVO_CONV1X1 takes it)',
    )
    parser.add_argument(
        '--conv1x1-inference',
        action='store_true',
        help='a 1x1 conv, the forward without gradients at B1 and B4: '
        "oneDNN, mmevo's matmul and its conv1x1",
    )
    parser.add_argument(
        '--acmix-conv',
        action='store_true',
        help="ACmix's grouped conv path, forward and forward + backward: "
        'oneDNN against mmevo::acmix_conv (CPU), at the layer shapes',
    )
    parser.add_argument(
        '--batch-norm',
        action='store_true',
        help='a training BatchNorm2d, forward and forward + backward: '
        "the module against mmevo's kernel (CPU), at ResNet-50's maps",
    )
    parser.add_argument(
        '--avg-pool',
        action='store_true',
        help="a strided involution's 2x2 average pool, forward and forward "
        "+ backward: the module against mmevo's depthwise conv (CPU)",
    )
    args = parser.parse_args()
    device, dtype = args.device, getattr(torch, args.dtype)
    clock = time.process_time if args.cpu_time else time.perf_counter
    torch.manual_seed(0)
    clock_name = 'CPU' if args.cpu_time else 'wall'
    where = (
        f'device={device} dtype={args.dtype} threads={torch.get_num_threads()}'
    )
    train = (
        f'fwd+bwd median of {args.repeat} ({clock_name} time); '
        'peak = tensor bytes above the inputs'
    )
    modes = {
        'inference': (
            inference_layouts,
            f'forward median of {args.repeat} ({clock_name} time)',
        ),
        'involution': (involution_layers, train),
        'conv1x1': (
            conv1x1_paths,
            f'fwd+bwd median of {args.repeat} ({clock_name} time), B4',
        ),
        'conv1x1_inference': (
            conv1x1_inference_paths,
            f'forward median of {args.repeat} ({clock_name} time)',
        ),
        'attention': (attention_layers, train),
        'acmix_conv': (
            acmix_conv_paths,
            f'median of {args.repeat} ({clock_name} time), B4',
        ),
        'batch_norm': (
            batch_norm_paths,
            f'median of {args.repeat} ({clock_name} time), B4',
        ),
        'avg_pool': (
            avg_pool_paths,
            f'median of {args.repeat} ({clock_name} time), B4',
        ),
    }
    for mode, (run, what) in modes.items():
        if getattr(args, mode):
            print(f'{where} {what}')
            run(device, dtype, args.repeat, clock)
            return
    print(f'{where} {train}')
    header = '| shape (B·C·H²·K·G) |' + ''.join(
        f' {n} ms | {n} MiB |' for n in args.impls
    )
    ratios = [
        n for n in ('unfold', 'shift') if n in args.impls and n != 'mmevo'
    ]
    if 'mmevo' in args.impls:
        header += ''.join(f' {n}/mmevo time |' for n in ratios) + (
            ' unfold/mmevo mem |' if 'unfold' in args.impls else ''
        )
    print(header)
    print('|' + '---|' * (header.count('|') - 1))
    bandwidth_rows = []
    for B, C, H, G in STAGES:
        x = torch.randn(
            B, C, H, H, device=device, dtype=dtype, requires_grad=True
        )
        w = (
            torch.randn(B, G, K, K, H, H, device=device, dtype=dtype) / K
        ).requires_grad_()
        gy = torch.randn(B, C, H, H, device=device, dtype=dtype)
        steps = {
            name: lambda fn=IMPLS[name], x=x, w=w, gy=gy: fwd_bwd(fn, x, w, gy)
            for name in args.impls
        }
        ms = time_ms(
            {
                name: lambda step=step, x=x, w=w: (reset_grads(x, w), step())
                for name, step in steps.items()
            },
            device,
            args.repeat,
            clock,
        )
        res = {}
        for name, step in steps.items():
            reset_grads(x, w)  # freed outside the measured step
            res[name] = (ms[name], peak_bytes(step, device) / 2**20)
        reset_grads(x, w)
        row = f'| {B}·{C}·{H}²·{K}·{G} |' + ''.join(
            f' {res[n][0]:.1f} | {res[n][1]:.1f} |' for n in args.impls
        )
        if 'mmevo' in res:
            row += ''.join(
                f' {res[n][0] / res["mmevo"][0]:.1f}× |' for n in ratios
            )
            if 'unfold' in res:
                mem = res['unfold'][1] / max(res['mmevo'][1], 1e-9)
                row += f' {mem:.1f}× |'
        print(row, flush=True)
        if device.type == 'cuda' and 'mmevo' in res:
            bw, fwd_ms = forward_bandwidth(
                mmevo_aggregate, x.detach(), w.detach(), device, args.repeat
            )
            bandwidth_rows.append((f'{B}·{C}·{H}²·{K}·{G}', fwd_ms, bw))
    if bandwidth_rows:
        name = torch.cuda.get_device_name(device)
        peak = (
            args.peak_gbps * 1e9
            if args.peak_gbps
            else next(
                (v for k, v in PEAK_BANDWIDTH.items() if k in name), None
            )
        )
        print(
            f'\nmmevo forward on {name} (bytes = read x and kernel, write y):'
        )
        print('| shape | fwd ms | GB/s | of peak |\n|---|---|---|---|')
        for shape, ms, bw in bandwidth_rows:
            frac = f'{bw / peak:.0%}' if peak else 'n/a'
            print(f'| {shape} | {ms:.3f} | {bw / 1e9:.0f} | {frac} |')


if __name__ == '__main__':
    main()
