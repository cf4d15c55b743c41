"""GPU check of mmevo: correctness on CUDA against float64, then speed.

Run it through ``tools/analysis/gpu_check.sh`` (installs the wheels of
``tools/analysis/gpu_wheels.sh`` first when mmcv / mmengine are missing).
Sections (``--sections``):

* ``ops``: every op (aggregation, correlation, attention weights), forward
  and every input gradient, in fp32 / fp16 / bf16 against
  ``mmevo/ops/reference.py`` in float64 (on the same rounded inputs), on
  seeded random geometries; each geometry runs one Triton tile config, so
  the sweep covers all of them without autotuning;
* ``double``: second derivatives of every op against the reference's, and
  ``gradgradcheck`` of the aggregation (CUDA);
* ``determinism``: two runs, identical bits (both padding modes);
* ``large``: a map of more than 2**31 elements (int64 offsets; CUDA);
* ``layers``: every layer, output and all gradients, Triton against the
  shift-and-add backend (``use_backend('torch')``) in float64, and under
  bf16 autocast against that float64 run;
* ``compile``: ``torch.compile(fullgraph=True)`` of an Involution against
  eager (CUDA);
* ``speed``: aggregation fwd+bwd at the RedNet-50 stage shapes against
  ``unfold`` and shift-and-add with the achieved bandwidth, Involution
  against a cuDNN depthwise 7x7 conv, RedNet-50 against ResNet-50 train
  steps (CUDA).

Without CUDA the same checks run on CPU tensors under ``TRITON_INTERPRET=1``
(small sizes; the CUDA-only sections are reported as not run), which is how
CI keeps this script working. Writes ``gpu_check.json`` and
``gpu_check.md`` into ``$OUT`` if set, else ``--out``; exits 1 on any
mismatch or error.

Example:
    bash tools/analysis/gpu_check.sh                      # all, on CUDA
    python tools/analysis/gpu_check.py --sections ops --geometries 20
"""
import argparse
import concurrent.futures
import copy
import json
import math
import multiprocessing
import os
import os.path as osp
import platform
import random
import statistics
import sys
import time
import traceback

import torch
import torch.nn.functional as F

from mmevo.ops import (evolution_aggregate, local_attention_weights,
                       local_correlation, output_size)
from mmevo.ops.library import primitives, use_backend
from mmevo.ops.reference import (aggregate_reference,
                                 attention_weights_reference,
                                 correlation_reference)

SECTIONS = ('ops', 'double', 'determinism', 'large', 'layers', 'compile',
            'speed')
CUDA_ONLY = ('large', 'compile', 'speed')
DTYPES = {
    'float32': torch.float32,
    'float16': torch.float16,
    'bfloat16': torch.bfloat16,
    'float64': torch.float64
}
# Max |got - ref| / max |ref| per tensor. The low-precision runs compare with
# the float64 reference of the same rounded inputs, so what is left is the
# output rounding (fp32 accumulation): a few ulps of the dtype.
TOL = {'float32': 2e-5, 'float16': 3e-3, 'bfloat16': 2e-2, 'float64': 1e-10}
# Layers under bf16 autocast against float64: a chain of bf16 layers, by
# the relative L2 norm of the difference.
AUTOCAST_TOL = 5e-2
COMPILE_TOL = 1e-4
# Planted mismatch, to prove the check fails: relative size added to the
# first checked tensor.
PERTURB = float(os.environ.get('MMEVO_GPU_CHECK_PERTURB', '0'))
# RedNet-50 stages: (C, H) with K = 7, G = C / 16.
STAGES = [(64, 56), (128, 28), (256, 14), (512, 7)]
IMAGE_SIZE = 224  # of the train steps
HBM_NOMINAL = {'H200': 4.8e12, 'H100': 3.35e12, 'A100': 2.0e12}


# ------------------------------------------------------------- comparison
def rel_err(got, ref, norm='max', floor=0.):
    """|got - ref| / max(|ref|, floor) as max norms (or L2 norms), in
    float64.

    A NaN or inf anywhere in ``got`` gives inf, an all-zero ``ref`` (and
    no floor) the absolute error.
    """
    got, ref = got.detach().double(), ref.detach().double()
    if got.shape != ref.shape:
        return math.inf
    if not torch.isfinite(got).all():
        return math.inf
    diff = got - ref
    if norm == 'max':
        num, den = diff.abs().max(), ref.abs().max()
    else:
        num, den = diff.norm(), ref.norm()
    num, den = float(num), max(float(den), floor)
    return num / den if den > 0 else num


class Report:
    """Collects checks (name, errors, tolerance, pass) and speed numbers."""

    def __init__(self):
        self.checks = []
        self.speed = {}
        self.perturbed = PERTURB == 0

    def check(self, section, name, errors, tol, **info):
        """Record one check: ``errors`` a dict of tensor name -> error."""
        if not self.perturbed and errors:
            first = next(iter(errors))
            errors = dict(errors, **{first: errors[first] + PERTURB})
            self.perturbed = True
        worst = max(errors.values()) if errors else 0.
        ok = bool(errors) and worst <= tol
        rec = dict(
            section=section,
            name=name,
            passed=ok,
            tol=tol,
            worst=worst,
            errors=errors,
            **info)
        self.checks.append(rec)
        if not ok:
            print(
                f'FAIL {section}: {name} worst={worst:.2e} tol={tol:.0e} ' +
                ' '.join(f'{k}={v:.2e}' for k, v in errors.items()),
                flush=True)
        return ok

    def error(self, section, name, exc):
        """Record a check that raised."""
        msg = f'{type(exc).__name__}: {exc}'
        self.checks.append(
            dict(
                section=section,
                name=name,
                passed=False,
                tol=None,
                worst=None,
                errors={},
                error=msg))
        print(f'FAIL {section}: {name} raised {msg}', flush=True)
        traceback.print_exc()

    def section_summary(self, section, seconds):
        recs = [c for c in self.checks if c['section'] == section]
        bad = [c for c in recs if not c['passed']]
        status = 'FAIL' if bad else 'ok  '
        print(
            f'{status} {section}: {len(recs)} checks, {len(bad)} failed '
            f'({seconds:.0f} s)',
            flush=True)

    @property
    def passed(self):
        return bool(self.checks) and all(c['passed'] for c in self.checks)


# ------------------------------------------------------------- geometries
def _signature(g):
    """The classes Triton specialises integer arguments on (== 1, % 16),
    of the sizes passed to the kernels: one compilation per signature."""
    Ho = output_size(g['H'], g['K'], g['stride'], g['padding'], g['dilation'])
    Wo = output_size(g['W'], g['K'], g['stride'], g['padding'], g['dilation'])
    vals = (g['C'], g['H'], g['W'], g['G'], Ho, Wo, g['K'], g['stride'],
            g['padding'], g['dilation'])
    return tuple((v == 1, v % 16 == 0) for v in vals)


def _fits(g):
    return all(
        output_size(s, g['K'], g['stride'], g['padding'], g['dilation']) >= 1
        for s in (g['H'], g['W']))


def make_geometries(n, seed, max_signatures, small):
    """``n`` seeded random window geometries, tiny maps first.

    Odd and even sizes, strides and dilations 1-3, groups 1..C, zeros and
    reflect padding ("same" and explicit), B = 1..4. New specialisation
    signatures are accepted until there are ``max_signatures`` of them,
    which bounds the number of kernel compilations.
    """
    rng = random.Random(seed)
    fixed = [
        dict(
            B=1,
            C=4,
            G=2,
            H=1,
            W=1,
            K=3,
            stride=1,
            dilation=1,
            padding=1,
            mode='zeros'),
        dict(
            B=2,
            C=6,
            G=3,
            H=2,
            W=3,
            K=3,
            stride=2,
            dilation=1,
            padding=1,
            mode='reflect'),
        dict(
            B=1,
            C=3,
            G=1,
            H=2,
            W=3,
            K=5,
            stride=1,
            dilation=2,
            padding=4,
            mode='reflect'),
        dict(
            B=3,
            C=5,
            G=5,
            H=1,
            W=1,
            K=1,
            stride=3,
            dilation=3,
            padding=0,
            mode='zeros'),
    ]
    geoms, sigs = [], {}
    while len(geoms) < n:
        if fixed:
            g = fixed.pop(0)
        else:
            K = rng.choice((1, 3, 3, 5) if small else (1, 3, 3, 5, 7, 7))
            Cg = rng.choice((1, 2, 3, 5) if small else (1, 2, 3, 7, 16, 20))
            G = rng.choice((1, 2, 3) if small else (1, 2, 3, 4, 5))
            d = rng.randint(1, 3)
            g = dict(
                B=rng.randint(1, 2 if small else 4),
                C=Cg * G,
                G=G,
                H=rng.randint(1, 7 if small else 23),
                W=rng.randint(1, 7 if small else 23),
                K=K,
                stride=rng.randint(1, 3),
                dilation=d,
                mode=rng.choice(('zeros', 'reflect')))
            same = d * (K - 1) // 2
            g['padding'] = same if rng.random() < .7 else rng.randint(
                0, same + 1)
        if not _fits(g):
            continue
        sig = _signature(g)
        if sig not in sigs and len(sigs) >= max_signatures:
            continue
        # The tile config of a geometry: round-robin over the signatures.
        g['signature'] = sigs.setdefault(sig, len(sigs))
        g['seed'] = seed * 100003 + len(geoms)
        geoms.append(g)
    return geoms


def _describe(g):
    return (f'B{g["B"]} C{g["C"]} G{g["G"]} {g["H"]}x{g["W"]} K{g["K"]} '
            f's{g["stride"]} d{g["dilation"]} p{g["padding"]} {g["mode"]}')


# -------------------------------------------------------------------- ops
def _inputs(g, dtype, device):
    """Seeded float64 tensors, already rounded to ``dtype``."""
    gen = torch.Generator().manual_seed(g['seed'])
    B, C, G, K = g['B'], g['C'], g['G'], g['K']
    Ho = output_size(g['H'], K, g['stride'], g['padding'], g['dilation'])
    Wo = output_size(g['W'], K, g['stride'], g['padding'], g['dilation'])

    def rnd(*shape, scale=1.):
        t = torch.randn(*shape, generator=gen, dtype=torch.float64) * scale
        return t.to(dtype).to(device=device, dtype=torch.float64)

    return dict(
        x=rnd(B, C, g['H'], g['W']),
        w=rnd(B, G, K, K, Ho, Wo, scale=1 / K),
        # Attention queries at the usual 1/sqrt(d) scale: O(1) logits.
        q=rnd(B, C, Ho, Wo, scale=(C // G)**-.5),
        gy=rnd(B, C, Ho, Wo),
        go=rnd(B, G, K, K, Ho, Wo))


def _op_calls(g):
    """name -> (mmevo op, reference, input names, grad-output name)."""
    win = (g['stride'], g['padding'], g['dilation'], g['mode'])
    grp = (g['G'], g['K'])
    return {
        'aggregate':
        (lambda x, w: evolution_aggregate(x, w, *win),
         lambda x, w: aggregate_reference(x, w, *win), ('x', 'w'), 'gy'),
        'correlation': (lambda q, x: local_correlation(q, x, *grp, *win),
                        lambda q, x: correlation_reference(q, x, *grp, *win),
                        ('q', 'x'), 'go'),
        'attention':
        (lambda q, x: local_attention_weights(q, x, *grp, *win),
         lambda q, x: attention_weights_reference(q, x, *grp, *win),
         ('q', 'x'), 'go'),
    }


def _forward_backward(fn, tensors, grad_out, dtype):
    """[output, grad of every input], run in ``dtype``."""
    inputs = [t.to(dtype).requires_grad_() for t in tensors]
    out = fn(*inputs)
    grads = torch.autograd.grad(out, inputs, grad_out.to(dtype))
    return [out.detach()] + list(grads)


def op_results(g, dtype, device, backend='triton'):
    """name -> [output, input grads] of every op on geometry ``g``."""
    t = _inputs(g, dtype, device)
    res = {}
    for name, (fn, ref, args, gout) in _op_calls(g).items():
        fn = fn if backend else ref
        with use_backend(backend or 'auto'):
            res[name] = _forward_backward(fn, [t[a] for a in args], t[gout],
                                          dtype if backend else torch.float64)
    return res


def sweep(geoms, dtype_names, device):
    """Check every op of ``geoms`` in ``dtype_names`` against float64.

    Returns:
        list[dict]: one record per (geometry, dtype, op).
    """
    triton_mod = _triton_module(device)
    out = []
    for g in geoms:
        ref = op_results(g, torch.float64, device, backend=None)
        cfg = g['signature'] % len(triton_mod.CONFIGS)
        for dname in dtype_names:
            with triton_mod.fixed_config(cfg):
                got = op_results(g, DTYPES[dname], device)
            for op, tensors in got.items():
                names = ['out'] + [f'grad_{a}' for a in _op_calls(g)[op][2]]
                errs = {
                    n: rel_err(a, b)
                    for n, a, b in zip(names, tensors, ref[op])
                }
                out.append(
                    dict(
                        op=op,
                        dtype=dname,
                        geometry=_describe(g),
                        config=cfg,
                        errors=errs))
    return out


def _triton_module(device):
    """The Triton backend module (whatever its file is called)."""
    with use_backend('triton'):
        return primitives(torch.empty(0, device=device))


def _sweep_task(args):
    """Worker: a shard of the sweep (own process, own CUDA context)."""
    geoms, dtype_names, device = args
    torch.backends.cuda.matmul.allow_tf32 = False
    return sweep(geoms, dtype_names, torch.device(device))


def run_ops(report, device, n, workers, dtype_names):
    small = device.type == 'cpu'
    geoms = make_geometries(n, 0, 6 if small else 32, small)
    if workers > 1:
        # Compiling is the cost: one shard per group of signatures, so each
        # kernel variant compiles in one process only.
        by_sig = {}
        for g in geoms:
            by_sig.setdefault(g['signature'], []).append(g)
        shards = [[] for _ in range(workers)]
        for gs in sorted(by_sig.values(), key=len, reverse=True):
            min(shards, key=len).extend(gs)
        ctx = multiprocessing.get_context('spawn')
        with concurrent.futures.ProcessPoolExecutor(
                workers, mp_context=ctx) as pool:
            parts = pool.map(_sweep_task, [(s, dtype_names, device.type)
                                           for s in shards if s])
            records = [r for part in parts for r in part]
    else:
        records = sweep(geoms, dtype_names, device)
    for dname in dtype_names:
        recs = [r for r in records if r['dtype'] == dname]
        for r in recs:
            report.check(
                'ops',
                f'{r["op"]} {r["dtype"]} {r["geometry"]}',
                r['errors'],
                TOL[dname],
                config=r['config'])
        worst = {}
        for r in recs:
            for k, v in r['errors'].items():
                key = f'{r["op"]}.{k}'
                worst[key] = max(worst.get(key, 0.), v)
        print(
            f'     {dname}: {len(geoms)} geometries, tol {TOL[dname]:.0e},'
            ' worst ' + ' '.join(f'{k}={v:.1e}' for k, v in worst.items()),
            flush=True)


# ----------------------------------------------------------- double, det
def run_double(report, device):
    """Second derivatives: d/d(inputs) of <v, grad(out)> against the
    reference's, every op, in float64."""
    mod = _triton_module(device)
    with mod.fixed_config(len(mod.CONFIGS) - 1):  # not autotuned
        _double(report, device)


def _double(report, device):
    g = dict(
        B=2,
        C=6,
        G=3,
        H=5,
        W=4,
        K=3,
        stride=2,
        dilation=1,
        padding=1,
        mode='reflect',
        seed=7)
    t = _inputs(g, torch.float64, device)
    for name, (fn, ref, args, gout) in _op_calls(g).items():
        results = []
        for f, backend in ((fn, 'triton'), (ref, 'auto')):
            inputs = [t[a].clone().requires_grad_() for a in args]
            with use_backend(backend):
                out = f(*inputs)
                grads = torch.autograd.grad(
                    out, inputs, t[gout], create_graph=True)
                vs = [
                    torch.randn(
                        gr.shape,
                        generator=torch.Generator().manual_seed(i),
                        dtype=torch.float64).to(device)
                    for i, gr in enumerate(grads)
                ]
                total = sum((gr * v).sum() for gr, v in zip(grads, vs))
                results.append(torch.autograd.grad(total, inputs))
        report.check('double', f'{name} second derivatives', {
            f'd2_{a}': rel_err(a_, b_)
            for a, a_, b_ in zip(args, *results)
        }, TOL['float64'])
    if device.type == 'cuda':
        x = torch.randn(
            1, 4, 5, 4, device=device, dtype=torch.float64, requires_grad=True)
        w = torch.randn(
            1,
            2,
            3,
            3,
            3,
            2,
            device=device,
            dtype=torch.float64,
            requires_grad=True)
        with use_backend('triton'):
            ok = torch.autograd.gradgradcheck(
                lambda a, b: evolution_aggregate(a, b, 2, 1, 1, 'reflect'),
                (x, w))
        report.check('double', 'aggregate gradgradcheck',
                     {'passed': 0. if ok else 1.}, 0.)


def run_determinism(report, device, dtype_names):
    """Two runs of every op, forward and gradients: identical bits."""
    geoms = make_geometries(1 if device.type == 'cpu' else 12, 1, 4,
                            device.type == 'cpu')
    triton_mod = _triton_module(device)
    for g in geoms:
        for dname in dtype_names:
            with triton_mod.fixed_config(g['signature'] %
                                         len(triton_mod.CONFIGS)):
                a, b = (op_results(g, DTYPES[dname], device) for _ in range(2))
            diff = {
                op: float(not all(map(torch.equal, a[op], b[op])))
                for op in a
            }
            report.check('determinism', f'{dname} {_describe(g)}', diff, 0.)


def run_large(report, device):
    """More than 2**31 elements per tensor: the kernels' int64 offsets."""
    B, C, H, W, K = 2, 1024, 1100, 1100, 3
    x = torch.randn(B, C, H, W, device=device, dtype=torch.float16)
    w = torch.randn(B, 1, K, K, H, W, device=device, dtype=torch.float16) / K
    x.requires_grad_()
    gy = torch.randn_like(x)
    with use_backend('triton'), _triton_module(device).fixed_config(0):
        y = evolution_aggregate(x, w, 1, 1, 1, 'zeros')
        (gx, ) = torch.autograd.grad(y, x, gy)
    # The last channels: offsets above 2**31.
    xs = x.detach()[:, -2:].double().requires_grad_()
    ys = aggregate_reference(xs, w.double(), 1, 1, 1, 'zeros')
    (gxs, ) = torch.autograd.grad(ys, xs, gy[:, -2:].double())
    report.check('large', f'aggregate fp16 {B}x{C}x{H}x{W} (> 2**31 elements)',
                 {
                     'out': rel_err(y[:, -2:], ys),
                     'grad_x': rel_err(gx[:, -2:], gxs)
                 }, TOL['float16'])


# ----------------------------------------------------------------- layers
def layer_cases():
    """(name, module factory, input shape) of every layer, odd sizes."""
    from mmevo.layers import (ELSA, ACmix, DynamicFilter, EvolutionConv,
                              Involution, LocalSelfAttention)
    return [
        ('EvolutionConv', lambda: EvolutionConv(8, 3, stride=2), (2, 8, 7, 6)),
        ('Involution', lambda: Involution(32, 7, stride=2), (2, 32, 15, 16)),
        ('DynamicFilter', lambda: DynamicFilter(16, stride=2), (2, 16, 7, 8)),
        ('LocalSelfAttention',
         lambda: LocalSelfAttention(16, num_heads=4, kernel_size=5, stride=2),
         (2, 16, 9, 8)),
        ('ELSA', lambda: ELSA(24, 2, kernel_size=3, stride=2), (2, 24, 7, 6)),
        ('ACmix', lambda: ACmix(32, 32, stride=2), (2, 32, 7, 3)),
    ]


def _layer_run(layer, x, backend, autocast=None):
    """[output, grad of input, grads of every parameter]."""
    layer.zero_grad(set_to_none=True)
    x = x.clone().requires_grad_()
    with use_backend(backend), torch.autocast(
            x.device.type,
            dtype=autocast or torch.float32,
            enabled=autocast is not None):
        out = layer(x)
    params = [p for p in layer.parameters() if p.requires_grad]
    gout = torch.randn(
        out.shape,
        generator=torch.Generator().manual_seed(3),
        dtype=torch.float64).to(x.device)
    grads = torch.autograd.grad(
        out, [x] + params, gout.to(out.dtype), allow_unused=True)
    # A compiled module prefixes the names of the layer's parameters.
    names = ['out', 'grad_input'] + [
        'grad_' + n.removeprefix('_orig_mod.')
        for n, p in layer.named_parameters() if p.requires_grad
    ]
    return dict(zip(names, [out] + list(grads)))


def run_layers(report, device, names):
    try:
        cases = layer_cases()
    except ImportError as exc:  # the wheels of gpu_wheels.sh are missing
        report.error('layers', 'import mmevo.layers', exc)
        return
    triton_mod = _triton_module(device)
    for i, (name, factory, shape) in enumerate(cases):
        if names and name not in names:
            continue
        # Not autotuned: each layer its own tile config.
        with triton_mod.fixed_config(i % len(triton_mod.CONFIGS)):
            try:
                _check_layer(report, name, factory, shape, device)
            except Exception as exc:  # noqa: BLE001 (reported: fails)
                report.error('layers', name, exc)


def _check_layer(report, name, factory, shape, device):
    torch.manual_seed(0)
    layer = factory().to(device)
    x = torch.randn(shape, generator=torch.Generator().manual_seed(0))
    x = x.to(device)
    ref = _layer_run(copy.deepcopy(layer).double(), x.double(), 'torch')
    got = _layer_run(copy.deepcopy(layer).double(), x.double(), 'triton')
    report.check('layers', f'{name} float64 triton vs torch',
                 layer_errors(got, ref, 'max'), TOL['float64'])
    low = _layer_run(copy.deepcopy(layer), x, 'triton', torch.bfloat16)
    report.check('layers', f'{name} bf16 autocast vs float64',
                 layer_errors(low, ref, 'l2'), AUTOCAST_TOL)


def layer_errors(got, ref, norm):
    """``rel_err`` of every tensor of a layer run, each one's reference
    norm floored at 1% of the largest: a gradient that is zero in theory
    (ACmix's positional-encoding bias: the softmax cancels it) holds only
    rounding noise, relative to which any difference is huge."""
    present = [k for k in ref if ref[k] is not None]
    size = {
        k:
        float(ref[k].detach().abs().max() if norm ==
              'max' else ref[k].detach().norm())
        for k in present
    }
    floor = 1e-2 * max(size.values())
    return {
        k: rel_err(got[k], ref[k], norm, floor)
        if got[k] is not None else math.inf
        for k in present
    }


def run_compile(report, device):
    from mmevo.layers import Involution
    torch.manual_seed(0)
    layer = Involution(64, 7).to(device)
    x = torch.randn(2, 64, 15, 17, device=device)
    with _triton_module(device).fixed_config(0):
        eager = _layer_run(layer, x, 'auto')
        compiled = torch.compile(layer, fullgraph=True)
        got = _layer_run(compiled, x, 'auto')
    report.check('compile', 'Involution torch.compile(fullgraph) vs eager',
                 {k: rel_err(got[k], eager[k])
                  for k in eager}, COMPILE_TOL)


# ------------------------------------------------------------------ speed
def time_ms(fn, repeat):
    """Median milliseconds of ``fn`` (CUDA events), after one warm-up."""
    fn()
    times = []
    for _ in range(repeat):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def unfold_aggregate(x, w):
    """The published involution aggregation: ``unfold``, weighted sum."""
    B, C, H, W = x.shape
    G, K = w.shape[1], w.shape[2]
    cols = F.unfold(x, K, 1, (K - 1) // 2, 1).view(B, G, C // G, K * K, H, W)
    return (w.view(B, G, 1, K * K, H, W) * cols).sum(3).view(B, C, H, W)


def _aggregate_fwd_bwd(fn, backend, x, w, gy):

    def step():
        x.grad = w.grad = None
        with use_backend(backend):
            fn(x, w).backward(gy)

    return step


def speed_bandwidth(report, repeat):
    n = 2**28  # 1 GiB of fp32
    src = torch.empty(n, device='cuda')
    dst = torch.empty_like(src)
    ms = time_ms(lambda: dst.copy_(src), repeat)
    bw = 2 * n * 4 / (ms * 1e-3)
    name = torch.cuda.get_device_name()
    nominal = next((v for k, v in HBM_NOMINAL.items() if k in name), None)
    report.speed['copy'] = dict(
        device=name, gbps=bw / 1e9, nominal_gbps=nominal and nominal / 1e9)
    print(
        f'     device-to-device copy: {bw / 1e9:.0f} GB/s' +
        (f' (nominal {nominal / 1e9:.0f})' if nominal else ''),
        flush=True)
    return bw


def speed_aggregation(report, batch, repeat, copy_bw):
    rows = []
    for dname in ('float32', 'bfloat16'):
        dtype = DTYPES[dname]
        for C, H in STAGES:
            G, K = C // 16, 7
            x = torch.randn(batch, C, H, H, device='cuda', dtype=dtype)
            w = torch.randn(
                batch, G, K, K, H, H, device='cuda', dtype=dtype) / K
            gy = torch.randn_like(x)
            # The autotuned configs must be right too: against the
            # shift-add formulation in float64.
            got = _forward_backward(evolution_aggregate, [x, w], gy, dtype)
            with use_backend('torch'):
                ref = _forward_backward(evolution_aggregate, [x, w], gy,
                                        torch.float64)
            report.check(
                'speed', f'aggregate {dname} {batch}x{C}x{H}x{H} autotuned'
                ' vs float64', {
                    n: rel_err(a, b)
                    for n, a, b in zip(('out', 'grad_x', 'grad_w'), got, ref)
                }, TOL[dname])
            del got, ref
            x.requires_grad_()
            w.requires_grad_()
            ms = {
                impl:
                time_ms(_aggregate_fwd_bwd(fn, backend, x, w, gy), repeat)
                for impl, (fn, backend) in {
                    'unfold': (unfold_aggregate, 'torch'),
                    'shift': (evolution_aggregate, 'torch'),
                    'mmevo': (evolution_aggregate, 'triton'),
                }.items()
            }
            # Least traffic of fwd (x, w -> y) + bwd (gy, w -> gx;
            # gy, x -> gw): 6 maps of x's size and 3 of w's.
            nbytes = (6 * x.numel() + 3 * w.numel()) * x.element_size()
            gbps = nbytes / (ms['mmevo'] * 1e-3) / 1e9
            row = dict(
                dtype=dname,
                C=C,
                H=H,
                G=G,
                batch=batch,
                ms=ms,
                gbps=gbps,
                of_copy=gbps * 1e9 / copy_bw)
            rows.append(row)
            print(
                f'     aggregate {dname:8s} {batch}x{C}x{H}x{H} G{G}: ' +
                ' '.join(f'{k} {v:.2f} ms' for k, v in ms.items()) +
                f', mmevo {gbps:.0f} GB/s ({row["of_copy"]:.0%} of copy)',
                flush=True)
            del x, w, gy
    report.speed['aggregation'] = rows


def speed_involution(report, batch, repeat):
    from mmevo.layers import Involution
    rows = []
    for dname in ('float32', 'bfloat16'):
        for C, H in STAGES:
            inv = Involution(C, 7).cuda()
            # cuDNN's depthwise conv of the same window, the baseline.
            conv = torch.nn.Conv2d(C, C, 7, padding=3, groups=C).cuda()
            x = torch.randn(batch, C, H, H, device='cuda', requires_grad=True)
            ms = {}
            for name, mod in (('involution', inv), ('depthwise', conv)):

                def step(mod=mod):
                    x.grad = None
                    with torch.autocast(
                            'cuda',
                            dtype=torch.bfloat16,
                            enabled=dname == 'bfloat16'):
                        y = mod(x)
                    y.float().sum().backward()

                ms[name] = time_ms(step, repeat)
            rows.append(dict(dtype=dname, C=C, H=H, batch=batch, ms=ms))
            print(
                f'     Involution-7 vs depthwise-7 {dname:8s} '
                f'{batch}x{C}x{H}x{H}: {ms["involution"]:.2f} vs '
                f'{ms["depthwise"]:.2f} ms',
                flush=True)
    report.speed['involution'] = rows


def build_backbones():
    """(RedNet-50, ResNet-50, builder name): mmevo/mmdet's if mmdet imports,
    else the plain-PyTorch ones of ``plain_backbones.py``."""
    try:
        from mmdet.models.backbones import ResNet

        from mmevo.models import RedNet
        return RedNet(depth=50), ResNet(50), 'mmevo/mmdet'
    except ImportError:
        sys.path.insert(0, osp.dirname(osp.abspath(__file__)))
        from plain_backbones import PlainResNet
        return (PlainResNet(50, involution=True), PlainResNet(50),
                'plain_backbones.py')


def _train_step(model, opt, x):
    """One SGD step of ``model`` on ``x`` in bf16 autocast."""

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast('cuda', dtype=torch.bfloat16):
            loss = sum(o.float().mean() for o in model(x))
        loss.backward()
        opt.step()

    return step


def _time_train_step(model, batch, repeat):
    """(ms, peak GiB) of a train step at ``batch``; None if out of memory."""
    opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=.9)
    x = torch.randn(batch, 3, IMAGE_SIZE, IMAGE_SIZE, device='cuda')
    step = _train_step(model, opt, x)
    try:
        step()  # autotuning, cudnn.benchmark
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        ms = time_ms(step, repeat)
    except torch.cuda.OutOfMemoryError:
        return None
    return ms, torch.cuda.max_memory_allocated() / 2**30


def speed_train_step(report, batch, repeat):
    rednet, resnet, builder = build_backbones()
    rows = []
    for name, model in (('RedNet-50', rednet), ('ResNet-50', resnet)):
        model.cuda()
        model.train()  # mmdet's ResNet.train returns None
        b = batch
        res = _time_train_step(model, b, repeat)
        if res is None:  # half the batch then
            torch.cuda.empty_cache()
            b = batch // 2
            res = _time_train_step(model, b, repeat)
        if res is None:
            raise RuntimeError(f'{name}: out of memory at batch {b}')
        ms, peak = res
        rows.append(
            dict(
                model=name,
                batch=b,
                ms=ms,
                images_per_s=b / ms * 1e3,
                peak_gib=peak,
                builder=builder))
        print(
            f'     train step {name} bf16 {b}x3x{IMAGE_SIZE}²: '
            f'{ms:.1f} ms, {b / ms * 1e3:.0f} img/s, peak {peak:.1f} GiB '
            f'({builder})',
            flush=True)
        model.cpu()
        torch.cuda.empty_cache()
    report.speed['train_step'] = rows


def _speed_shapes():
    """(C, H, stride, dtype name) of every aggregation the speed section
    runs: the stages in fp32 and bf16, RedNet-50's stem and strided
    blocks in bf16."""
    return ([(C, H, 1, d) for d in ('float32', 'bfloat16')
             for C, H in STAGES] + [(32, 112, 1, 'bfloat16')] +
            [(C, 2 * H, 2, 'bfloat16') for C, H in STAGES[1:]])


def _warm_task(index):
    """Worker: compile tile config ``index`` of the kernels at every speed
    shape (batch 1: the batch is not a kernel argument), so that
    autotuning later finds them in Triton's disk cache."""
    mod = _triton_module(torch.device('cuda'))
    with mod.fixed_config(index), use_backend('triton'):
        for C, H, s, dname in _speed_shapes():
            Ho = output_size(H, 7, s, 3, 1)
            x = torch.randn(1, C, H, H, device='cuda', dtype=DTYPES[dname])
            w = torch.randn(
                1, C // 16, 7, 7, Ho, Ho, device='cuda', dtype=DTYPES[dname])
            gy = torch.randn(1, C, Ho, Ho, device='cuda', dtype=DTYPES[dname])
            _forward_backward(lambda a, b: evolution_aggregate(a, b, s),
                              [x, w], gy, DTYPES[dname])
    torch.cuda.synchronize()


def run_speed(report, batch, repeat, workers):
    torch.backends.cudnn.benchmark = True
    n_configs = len(_triton_module(torch.device('cuda')).CONFIGS)
    if workers > 1:
        ctx = multiprocessing.get_context('spawn')
        with concurrent.futures.ProcessPoolExecutor(
                min(workers, n_configs), mp_context=ctx) as pool:
            list(pool.map(_warm_task, range(n_configs)))
    copy_bw = speed_bandwidth(report, repeat)
    speed_aggregation(report, batch, repeat, copy_bw)
    speed_involution(report, batch, repeat)
    speed_train_step(report, batch, repeat)


# ----------------------------------------------------------------- output
def _fmt(v):
    return f'{v:.2e}' if isinstance(v, float) else str(v)


def write_outputs(report, out_dir, meta):
    os.makedirs(out_dir, exist_ok=True)
    result = dict(
        meta,
        passed=report.passed,
        checks=report.checks,
        speed=report.speed,
        failures=[c['name'] for c in report.checks if not c['passed']])
    with open(osp.join(out_dir, 'gpu_check.json'), 'w') as f:
        json.dump(result, f, indent=1)
    lines = [
        f'# GPU check: {"PASSED" if report.passed else "FAILED"}', '',
        ', '.join(f'{k}: {v}' for k, v in meta.items() if k != 'sections'), '',
        '| section | checks | failed | worst error | tolerance |',
        '|---|---|---|---|---|'
    ]
    for s in meta['sections']:
        recs = [c for c in report.checks if c['section'] == s]
        if not recs:
            lines.append(f'| {s} | not run (needs CUDA) | | | |')
            continue
        bad = sum(not c['passed'] for c in recs)
        ratio = max(
            recs,
            key=lambda c: (c['worst'] or 0) / (c['tol'] or 1)
            if c['worst'] is not None else math.inf)
        lines.append(f'| {s} | {len(recs)} | {bad} | {_fmt(ratio["worst"])} '
                     f'| {_fmt(ratio["tol"])} |')
    sp = report.speed
    if 'copy' in sp:
        lines += [
            '', f'Device-to-device copy: {sp["copy"]["gbps"]:.0f} GB/s '
            f'on {sp["copy"]["device"]}.'
        ]
    if 'aggregation' in sp:
        lines += [
            '', 'Aggregation fwd+bwd (ms), K=7, G=C/16:', '',
            '| dtype | B·C·H² | unfold | shift-add | mmevo | mmevo GB/s | '
            'of copy |', '|---|---|---|---|---|---|---|'
        ]
        lines += [
            f'| {r["dtype"]} | {r["batch"]}·{r["C"]}·{r["H"]}² | '
            f'{r["ms"]["unfold"]:.2f} | {r["ms"]["shift"]:.2f} | '
            f'{r["ms"]["mmevo"]:.2f} | {r["gbps"]:.0f} | '
            f'{r["of_copy"]:.0%} |' for r in sp['aggregation']
        ]
    if 'involution' in sp:
        lines += [
            '', 'Involution-7 vs cuDNN depthwise 7x7, fwd+bwd (ms):', '',
            '| dtype | B·C·H² | involution | depthwise |', '|---|---|---|---|'
        ]
        lines += [
            f'| {r["dtype"]} | {r["batch"]}·{r["C"]}·{r["H"]}² | '
            f'{r["ms"]["involution"]:.2f} | {r["ms"]["depthwise"]:.2f} |'
            for r in sp['involution']
        ]
    if 'train_step' in sp:
        lines += [
            '', f'Train step (fwd+bwd+SGD), bf16 autocast, '
            f'{IMAGE_SIZE}²:', '',
            '| model | batch | ms | images/s | peak GiB | built by |',
            '|---|---|---|---|---|---|'
        ]
        lines += [
            f'| {r["model"]} | {r["batch"]} | {r["ms"]:.1f} | '
            f'{r["images_per_s"]:.0f} | {r["peak_gib"]:.1f} | '
            f'{r["builder"]} |' for r in sp['train_step']
        ]
    failures = result['failures']
    if failures:
        lines += ['', 'Failures:', ''] + [f'* {n}' for n in failures]
    with open(osp.join(out_dir, 'gpu_check.md'), 'w') as f:
        f.write('\n'.join(lines) + '\n')


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument(
        '--out',
        default='work_dirs/gpu_check',
        help='output folder ($OUT wins when set)')
    parser.add_argument(
        '--sections', nargs='+', default=list(SECTIONS), choices=SECTIONS)
    parser.add_argument(
        '--geometries',
        type=int,
        default=None,
        help='random geometries of the ops sweep '
        '(default 160 on CUDA, 6 on CPU)')
    parser.add_argument(
        '--workers',
        type=int,
        default=None,
        help='processes of the ops sweep and of the warm-up '
        'compilation (compiling the kernel variants is '
        'their cost; default 8 on CUDA, 1 on CPU)')
    parser.add_argument(
        '--layers',
        nargs='+',
        default=None,
        help='layers to check (default: all)')
    parser.add_argument('--batch', type=int, default=64)
    parser.add_argument('--repeat', type=int, default=5)
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    cuda = torch.cuda.is_available()
    if not cuda and os.environ.get('TRITON_INTERPRET') != '1':
        raise SystemExit('no CUDA device: run with TRITON_INTERPRET=1 (CPU '
                         'tensors through the Triton interpreter)')
    device = torch.device('cuda' if cuda else 'cpu')
    # Correctness in true fp32 (the speed section restores the defaults).
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    import triton
    meta = dict(
        device_kind='cuda' if cuda else 'cpu (TRITON_INTERPRET=1)',
        device=torch.cuda.get_device_name() if cuda else platform.machine(),
        torch=torch.__version__,
        triton=triton.__version__,
        python=platform.python_version(),
        sections=args.sections)
    print(
        'gpu_check: ' + ', '.join(f'{k}={v}'
                                  for k, v in meta.items() if k != 'sections'),
        flush=True)
    n = args.geometries or (160 if cuda else 6)
    if args.workers is None:
        args.workers = min(8, os.cpu_count() or 1) if cuda else 1
    dtype_names = ['float32', 'float16', 'bfloat16']
    report = Report()
    for section in args.sections:
        if section in CUDA_ONLY and not cuda:
            print(f'     {section}: not run (needs CUDA)', flush=True)
            continue
        start = time.perf_counter()
        try:
            if section == 'ops':
                run_ops(report, device, n, args.workers, dtype_names)
            elif section == 'double':
                run_double(report, device)
            elif section == 'determinism':
                run_determinism(
                    report, device,
                    ['float32', 'bfloat16'] if cuda else ['float32'])
            elif section == 'large':
                run_large(report, device)
            elif section == 'layers':
                run_layers(report, device, args.layers)
            elif section == 'compile':
                run_compile(report, device)
            elif section == 'speed':
                torch.backends.cuda.matmul.allow_tf32 = False
                torch.backends.cudnn.allow_tf32 = True
                run_speed(report, args.batch, args.repeat, args.workers)
        except Exception as exc:  # noqa: BLE001 (reported, the check fails)
            report.error(section, section, exc)
        report.section_summary(section, time.perf_counter() - start)
        if cuda:
            torch.cuda.empty_cache()
    out_dir = os.environ.get('OUT') or args.out
    write_outputs(report, out_dir, meta)
    print(
        f'{"PASSED" if report.passed else "FAILED"}: '
        f'{sum(not c["passed"] for c in report.checks)} of '
        f'{len(report.checks)} checks failed; '
        f'{osp.join(out_dir, "gpu_check.md")}',
        flush=True)
    return 0 if report.passed else 1


if __name__ == '__main__':
    sys.exit(main())
