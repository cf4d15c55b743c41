"""AOTInductor deployment (mmevo/deploy/aoti.py): ``torch.export`` of the
evolution layers with H and W dynamic keeps mmevo's operators (or inlines
their standard-operator formulation), equal to PyTorch at other sizes; the
compiled package equals PyTorch too."""

import json
import os
import subprocess
import sys
import warnings

import pytest
import torch

import mmevo.models
from mmevo.deploy import AotiModel, TensorOutputs, export_aoti
from mmevo.deploy.aoti import (
    FREEZING_FIX_WRITTEN_FOR,
    compile_program,
    export_program,
    freezing_keeps_shared_constants,
)
from mmevo.deploy.runtime import InputMismatchError, InputSpec
from mmevo.layers import Involution, LocalSelfAttention
from mmevo.models import ELSASwinTransformer

# this folder is on sys.path
from layer_cases import LAYERS

pytestmark = pytest.mark.slow

MMEVO_OPS = {
    'mmevo.evolution_aggregate.default',
    'mmevo.fused_involution.default',
    'mmevo.local_correlation.default',
    'mmevo.local_attention_weights.default',
}


def graph_ops(program):
    return {
        str(n.target) for n in program.graph.nodes if n.op == 'call_function'
    }


def assert_close(outputs, expected):
    assert len(outputs) == len(expected)
    for out, ref in zip(outputs, expected, strict=True):
        assert out.shape == ref.shape
        err = (out - ref).abs().max() / ref.abs().max().clamp(min=1e-6)
        assert err <= 1e-4, float(err)


def flat(module):
    return TensorOutputs(module.eval(), lambda m, x: m(x))


@pytest.mark.parametrize('name', list(LAYERS))
@pytest.mark.parametrize('stride', [1, 2])
def test_layer_program_dynamic(name, stride):
    """One program for every size: mmevo's operators in the graph, equal
    to the eager layer at odd sizes, another aspect, maps smaller than the
    reflect padding and maps on the other side of the CPU fast paths' size
    thresholds (which must not become guards of the program)."""
    torch.manual_seed(0)
    model = flat(LAYERS[name](stride))
    program = export_program(model, torch.randn(1, 16, 9, 11))
    assert graph_ops(program) & MMEVO_OPS
    # torch.export takes a dynamic size for >= 2: the smallest map here
    # gives outputs of 2 at stride 2
    for hw in [(9, 11), (6, 13), (3 * stride, 2 * stride), (31, 37)]:
        x = torch.randn(1, 16, *hw)
        with torch.no_grad():
            assert_close(program.module()(x), model(x))


def test_two_stage_program_serves_larger_sizes():
    """A narrow RedNet Faster R-CNN exported at 128^2 runs at 2.5 times
    that: the RPN keeps ``nms_pre`` proposals of a level at every size, and
    no size of the example settles a branch (a guard, which a package does
    not check: there the proposals overran their bound at 320^2)."""
    from mmevo.apis import build_model, load_config
    from mmevo.deploy import match_rows
    from mmevo.deploy.mmdet import two_stage_forward

    cfg = load_config(
        'configs/rednet/faster-rcnn_rednet50_inv-neck-head_1x_coco.py',
        {
            'model.backbone': dict(
                depth=26, stem_channels=32, base_channels=16, init_cfg=None
            ),
            'model.neck.in_channels': [64, 128, 256, 512],
            'model.test_cfg.rpn.max_per_img': 60,
        },
    )
    torch.manual_seed(0)
    model = build_model(cfg)
    model.init_weights()
    model = TensorOutputs(model.eval(), two_stage_forward)
    program = export_program(model, torch.randn(1, 3, 128, 128))
    # level 1 (stride 8) has 768 anchors at 128^2, below nms_pre (1000),
    # and 6240 at 320 x 416; every involution map crosses 14^2 pixels
    for hw in [(128, 128), (320, 416)]:
        x = torch.randn(1, 3, *hw)
        with torch.no_grad():
            expected = model(x)
            outputs = program.module()(x)
        assert len(expected[0]) == 60
        assert_close(match_rows(outputs, expected), expected)


@pytest.mark.parametrize(
    'name', ['ELSASwinTransformer', 'ACmixSwinTransformer']
)
def test_swin_program_serves_other_paddings(name):
    """A narrow Swin of the detection geometry exported at 448^2, where
    every stage's map is a multiple of the window, runs at sizes that pad
    each stage: the crop back from a padded map records no stride (a
    guard on whether the map was padded refused them).

    Slow: an export of a Swin backbone, 10-30 s."""
    torch.manual_seed(0)
    backbone = getattr(mmevo.models, name)(
        embed_dims=16,
        depths=(1, 1, 1, 2),
        num_heads=(1, 2, 4, 8),
        pad_small_map=True,
    )
    model = flat(backbone)
    program = export_program(model, torch.randn(1, 3, 448, 448))
    spec = InputSpec.of_program(program)[0]
    # at least two windows a side in every stage (a window count of 1 is
    # a size torch.export specialises on: the test below)
    for hw in [(448, 448), (320, 384), (250, 330)]:
        x = torch.randn(1, 3, *hw)
        spec.check(x)  # what a package of it takes
        with torch.no_grad():
            assert_close(program.module()(x), model(x))


def test_package_record_refuses_sizes_its_program_refuses():
    """An ELSA-Swin exported at 224^2 has one window in its last stage,
    which torch.export specialises on: its program refuses 320 x 384 (two
    windows a side), and so does the record a package of it keeps (such a
    package computed numbers 17-19% off at 300 x 170 and 33 x 250).

    Slow: one export of a Swin backbone, 10-20 s."""
    torch.manual_seed(0)
    model = flat(
        ELSASwinTransformer(
            embed_dims=16,
            depths=(1, 1, 1, 2),
            num_heads=(1, 2, 4, 8),
            pad_small_map=True,
        )
    )
    program = export_program(model, torch.randn(1, 3, 224, 224))
    spec = InputSpec.from_dict(InputSpec.of_program(program)[0].to_dict())
    spec.check(torch.randn(1, 3, 224, 224))
    spec.check(torch.randn(1, 3, 70, 90))
    for hw in [(320, 384), (300, 170)]:
        x = torch.randn(1, 3, *hw)
        with pytest.raises(Exception, match='Guard failed'):
            program.module()(x)
        with pytest.raises(
            InputMismatchError,
            match=r'sizes where .* is false.*export it at a size like this',
        ):
            spec.check(x)


@pytest.mark.parametrize('stride', [1, 2])
def test_inlined_program_has_no_mmevo_ops(stride):
    torch.manual_seed(0)
    model = flat(
        torch.nn.Sequential(
            Involution(16, 7, stride=stride, group_channels=8),
            LocalSelfAttention(
                16,
                kernel_size=5,
                num_heads=4,
                padding_mode='reflect',
                rel_pos_bias=True,
            ),
        )
    )
    x = torch.randn(1, 16, 9, 11)
    program = export_program(model, x, dynamic=False, inline_ops=True)
    assert not graph_ops(program) & MMEVO_OPS
    assert not any(op.startswith('mmevo.') for op in graph_ops(program))
    with torch.no_grad():
        assert_close(program.module()(x), model(x))


def test_package_program_fuses_involutions():
    """A CPU package's program computes each involution as one
    ``mmevo::fused_involution`` (the kernel map never written), equal to
    the eager layer at other sizes; ``fused_involution=False``, a CUDA or
    inlined program and a layer with a kernel hook keep the stock graph."""
    torch.manual_seed(0)
    layers = [Involution(16, 7, stride=s, group_channels=8) for s in (1, 2)]
    model = flat(torch.nn.Sequential(torch.nn.Conv2d(16, 16, 3), *layers))
    x = torch.randn(1, 16, 12, 11)
    fused = export_program(model, x)
    ops = [str(n.target) for n in fused.graph.nodes if n.op == 'call_function']
    assert ops.count('mmevo.fused_involution.default') == 2
    assert 'mmevo.evolution_aggregate.default' not in ops
    for hw in [(12, 11), (9, 16), (30, 7)]:
        x = torch.randn(1, 16, *hw)
        with torch.no_grad():
            assert_close(fused.module()(x), model(x))
    stock = export_program(model, x, fused_involution=False)
    assert 'mmevo.fused_involution.default' not in graph_ops(stock)
    assert 'mmevo.evolution_aggregate.default' in graph_ops(stock)
    handle = layers[1].register_kernel_hook(lambda *args: None)
    try:
        hooked = export_program(model, x)
    finally:
        handle.remove()
    handle = layers[0].conv2.register_forward_hook(lambda *args: None)
    try:
        hooked_span = export_program(model, x)
    finally:
        handle.remove()
    for program in (hooked, hooked_span):
        hooked_ops = [
            str(n.target)
            for n in program.graph.nodes
            if n.op == 'call_function'
        ]
        assert hooked_ops.count('mmevo.fused_involution.default') == 1
        assert hooked_ops.count('mmevo.evolution_aggregate.default') == 1


def test_export_error_names_the_layer(tmp_path):

    class Broken(Involution):
        def generate(self, x):  # a kernel one row short reaches the op
            x, kernel = super().generate(x)
            return x, kernel[..., :-1, :]

    model = torch.nn.Sequential()
    model.add_module('inv', Broken(16, 3))
    with pytest.raises(
        RuntimeError,
        match=r"torch.export failed in layer 'model.inv' \(Broken: "
        r'kernel_size=3, stride=1',
    ):
        export_aoti(
            flat(model), torch.randn(1, 16, 8, 8), str(tmp_path / 'x.pt2')
        )
    assert not (tmp_path / 'x.pt2').exists()


@pytest.mark.slow
def test_layers_package_dynamic(tmp_path):
    """The compiled package (1-3 minutes on a 2-core CPU) at the export
    size and others, odd ones too, against eager PyTorch."""
    torch.manual_seed(0)
    model = flat(
        torch.nn.Sequential(
            Involution(16, 7, stride=2, group_channels=8),
            LocalSelfAttention(
                16,
                kernel_size=5,
                num_heads=4,
                padding_mode='reflect',
                rel_pos_bias=True,
            ),
            # a convolution's channels-last output into the fused involution
            torch.nn.Conv2d(16, 16, 3, padding=1),
            Involution(16, 5, group_channels=4),
        )
    )
    path = str(tmp_path / 'layers.pt2')
    # an even example, odd sizes after it: the stride-2 pooling's ceil
    assert export_aoti(model, torch.randn(1, 16, 8, 10), path) == path
    package = AotiModel(path)
    for hw in [(8, 10), (9, 11), (16, 7), (5, 4)]:
        x = torch.randn(1, 16, *hw)
        with torch.no_grad():
            assert_close(package(x), model(x))


class _ConvNet(torch.nn.Module):
    """Convolutions of every kind a package fuses: with batch norm and
    ReLU, strided, depthwise, dilated, a residual add, an involution's
    1x1 reduce and span convolutions, and wide 1x1 ones (16 -> 256 -> 64),
    whose oneDNN weight layout changes with the map's size (on an AVX2
    host at one thread: between 16 x 20 and 4 x 5)."""

    def __init__(self):
        super().__init__()

        def conv_bn(cin, cout, k, **kw):
            return torch.nn.Sequential(
                torch.nn.Conv2d(cin, cout, k, padding=k // 2, **kw),
                torch.nn.BatchNorm2d(cout),
            )

        self.stem = conv_bn(3, 16, 3, stride=2)
        self.dw = conv_bn(16, 16, 3, groups=16)
        self.dilated = torch.nn.Conv2d(16, 16, 3, padding=2, dilation=2)
        self.inv = Involution(16, 3, group_channels=8)
        self.wide = torch.nn.Conv2d(16, 256, 1)
        self.narrow = torch.nn.Conv2d(256, 64, 1)
        for m in self.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                m.running_mean.uniform_(-1, 1)
                m.running_var.uniform_(0.5, 2)

    def forward(self, x):
        x = self.stem(x).relu()
        x = (self.dw(x) + x).relu()
        x = self.inv(self.dilated(x)).relu()
        return self.narrow(self.wide(x).relu())


def _weight_reorders(path, sizes, threads=1):
    """``{size: [source layout, ...]}``: oneDNN's reorders in the second
    call of the package at ``path`` at each size, on ``threads`` threads
    (``ONEDNN_VERBOSE``, read at oneDNN's start: a process of its own), by
    the layout each reorders from (``abcd``: a plain tensor; ``Acdb16a``: a
    blocked, prepacked one)."""
    script = (
        'import sys, torch, mmevo.deploy\n'
        'm = mmevo.deploy.AotiModel(sys.argv[1])\n'
        'for hw in sys.argv[2:]:\n'
        '    x = torch.randn(1, 3, *map(int, hw.split("x")))\n'
        '    m(x)\n'
        '    print("SECOND", flush=True)\n'
        '    m(x)\n'
        '    print("END", flush=True)\n'
    )
    out = subprocess.run(
        [sys.executable, '-c', script, path] + [f'{h}x{w}' for h, w in sizes],
        capture_output=True,
        text=True,
        env={
            **os.environ,
            'ONEDNN_VERBOSE': '1',
            'OMP_NUM_THREADS': str(threads),
        },
        check=True,
    ).stdout
    calls = [part.split('END', 1)[0] for part in out.split('SECOND')[1:]]
    assert len(calls) == len(sizes), out[-2000:]
    reorders = {}
    for size, call in zip(sizes, calls, strict=True):
        execs = [
            line for line in call.splitlines() if ',primitive,exec,' in line
        ]
        assert any(',convolution,' in line for line in execs), out[-2000:]
        # "...,reorder,...,src:f32::blocked:abcd::f0 dst:...": the src tag
        reorders[size] = [
            line.split('src:')[1].split()[0].split(':')[3]
            for line in execs
            if ',reorder,' in line
        ]
    return reorders


def test_prepack_needs_a_frozen_dynamic_program(tmp_path):
    """``prepack`` lays out a dynamic package's weights: asked of a static
    program (whose weights Inductor's freezing lays out itself) or of one
    not frozen, it is refused before any compile, naming the argument."""
    model = flat(_ConvNet())
    x = torch.randn(1, 3, 16, 20)
    path = str(tmp_path / 'p.pt2')
    static = export_program(model, x, dynamic=False)
    with pytest.raises(ValueError, match=r'prepack .* static sizes'):
        compile_program(static, path, prepack=True)
    with pytest.raises(ValueError, match=r'prepack .* freeze=False'):
        compile_program(export_program(model, x), path, False, True)
    with pytest.raises(ValueError, match=r'prepack .* static sizes'):
        export_aoti(model, x, path, dynamic=False, prepack=True)
    assert not os.path.exists(path)


@pytest.mark.slow
def test_conv_weight_layouts(tmp_path):
    """A dynamic package keeps its convolution weights plain by default, so
    that at every size oneDNN reorders from the plain layout only (from a
    layout prepacked for another size it takes a slow generic path: a
    ResNet-50 or RedNet-50 package 3-10x the plain one's time); with
    ``prepack=True`` they are laid out at compile time (no reorder at the
    example's size). Both equal PyTorch at every size.

    Slow: two compiles of a small net (about 20 s each) and one process
    per package reading oneDNN's log."""
    torch.manual_seed(0)
    model = flat(_ConvNet())
    example = (32, 40)
    sizes = [example, (33, 27), (64, 64), (7, 9)]
    # the involution's span convolution among the convolutions
    program = export_program(
        model, torch.randn(1, 3, *example), fused_involution=False
    )
    paths = {}
    for prepack in (False, True):
        paths[prepack] = str(tmp_path / f'convs-{prepack}.pt2')
        compile_program(program, paths[prepack], prepack=prepack)
    plain = _weight_reorders(paths[False], sizes)
    assert len(plain[example]) >= 7, plain
    for sources in plain.values():
        assert all(s.isalpha() and s.islower() for s in sources), plain
    assert _weight_reorders(paths[True], [example]) == {example: []}
    for prepack, path in paths.items():
        package = AotiModel(path)
        threads = torch.get_num_threads()
        laid_out = {'threads': threads, 'size': list(example)}
        assert package.weight_layout == (laid_out if prepack else None)
        with warnings.catch_warnings(record=True) as record:
            warnings.simplefilter('always')
            for hw in sizes:
                x = torch.randn(1, 3, *hw)
                with torch.no_grad():
                    assert_close(package(x), model(x))
        # prepacked, one warning: at the first size after the example's
        assert len(record) == prepack, [str(r.message) for r in record]
        if prepack:
            assert f'at {sizes[1][0]}x{sizes[1][1]}' in str(record[0].message)


def _reads_a_constant_twice():
    """x + c, and c * 2 which nothing reads: two get_attr nodes of c."""
    gm = torch.fx.GraphModule(torch.nn.Module(), torch.fx.Graph())
    gm.register_buffer('c', torch.arange(4.0))
    g = gm.graph
    x = g.placeholder('x')
    first, second = g.get_attr('c'), g.get_attr('c')
    y = g.call_function(torch.ops.aten.add.Tensor, (x, first))
    g.call_function(torch.ops.aten.mul.Tensor, (second, 2.0))
    g.output(y)
    gm.recompile()
    return gm


@pytest.mark.skipif(
    not torch.__version__.startswith(FREEZING_FIX_WRITTEN_FOR + '.'),
    reason='the fix applies to the torch release it was written for',
)
def test_freezing_keeps_a_constant_read_twice():
    """Inductor's freezing folds a graph that reads one constant from two
    nodes, one of which folds away, under freezing_keeps_shared_constants
    (stock: "references nonexistent attribute"), and leaves the stock
    folding in place after it."""
    from torch._inductor import freezing

    stock = freezing.constant_fold
    with pytest.raises(RuntimeError, match='nonexistent attribute'):
        stock(_reads_a_constant_twice())
    gm = _reads_a_constant_twice()
    with freezing_keeps_shared_constants():
        freezing.constant_fold(gm)
    assert freezing.constant_fold is stock
    assert_close(gm(torch.ones(4)), torch.arange(1.0, 5.0))


# Run without TRITON_INTERPRET (this process has it): tracing records
# compiled kernels only. Without a GPU, Triton's mutation analysis warns
# and assumes every argument written (on CUDA it reads the kernel's IR).
CUDA_PROGRAM = """
import json, sys, logging, torch
from torch._functorch.aot_autograd import aot_export_module
from mmevo.deploy import TensorOutputs
from mmevo.deploy.aoti import export_program
from mmevo.layers import Involution, LocalSelfAttention, ACmix
from tools.analysis.kernels import aot as triton_aot
logging.disable(logging.WARNING)
torch.manual_seed(0)
model = TensorOutputs(torch.nn.Sequential(
    Involution(16, 7, stride=2, group_channels=8),
    LocalSelfAttention(16, kernel_size=5, num_heads=4, padding_mode='reflect'),
    ACmix(16, 16),
).eval(), lambda m, x: m(x))
x = torch.randn(1, 16, 24, 20)
program = export_program(model, x, triton_kernels=True)
ops = sorted({str(n.target) for n in program.graph.nodes
              if str(n.target).startswith('mmevo.')})
gm, _ = aot_export_module(program.module(), (x,), trace_joint=False)
jobs = triton_aot.graph_jobs(gm, [90])
rows = triton_aot.run(jobs, processes=2, cache=triton_aot.CACHE)
json.dump(dict(ops=ops, jobs=jobs, rows=rows), sys.stdout)
"""


@pytest.mark.xdist_group('two_cores')  # two compiling processes
def test_cuda_program_holds_compiled_triton_kernels():
    """What a CUDA package compiles, built on CPU: every mmevo op exported
    as its Triton op, traced (as Inductor does) into launches of mmevo's
    kernels, each compiling for sm_90 in every autotuned config with the
    traced column block, without spills (16 compiles, kept in
    ``triton_aot.CACHE`` as the compile matrix's)."""
    env = {k: v for k, v in os.environ.items() if k != 'TRITON_INTERPRET'}
    env['PYTHONPATH'] = os.path.dirname(
        os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    )
    out = subprocess.run(
        [sys.executable, '-c', CUDA_PROGRAM],
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert out.returncode == 0, out.stderr[-4000:]
    result = json.loads(out.stdout)
    assert result['ops'] == [
        'mmevo.triton_aggregate.default',
        'mmevo.triton_attention_weights.default',
        'mmevo.triton_correlation.default',
    ]
    kernels = {(j['kernel'], j['block_w']) for j in result['jobs']}
    # every map after the stride-2 involution is 12 x 10
    assert kernels == {('aggregate', 16), ('correlate', 16)}
    assert len(result['jobs']) == 2 * 8
    for row in result['rows']:
        assert row['error'] is None, row
        assert row['spill_bytes'] == 0, row


def test_export_program_refuses_inline_and_triton():
    with pytest.raises(ValueError, match='exclude each other'):
        export_program(
            flat(Involution(16, 3)),
            torch.randn(1, 16, 8, 8),
            inline_ops=True,
            triton_kernels=True,
        )


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason='needs CUDA')
def test_cuda_package_runs_without_mmevo(tmp_path):
    """A CUDA package holds mmevo's kernels: equal to PyTorch at two sizes,
    and run in a process that never imports mmevo."""
    torch.manual_seed(0)
    model = flat(
        torch.nn.Sequential(
            Involution(16, 7, stride=2, group_channels=8),
            LocalSelfAttention(16, kernel_size=5, padding_mode='reflect'),
        )
    ).cuda()
    path = str(tmp_path / 'model.pt2')
    export_aoti(model, torch.randn(1, 16, 32, 24, device='cuda'), path)
    package = AotiModel(path)
    for hw in [(32, 24), (27, 41)]:
        x = torch.randn(1, 16, *hw, device='cuda')
        with torch.no_grad():
            assert_close(package(x), model(x))
    code = (
        'import sys, torch\n'
        f'runner = torch._inductor.aoti_load_package({path!r})\n'
        "y = runner(torch.randn(1, 16, 20, 20, device='cuda'))\n"
        "assert 'mmevo' not in sys.modules and torch.isfinite(y[0]).all()\n"
    )
    out = subprocess.run(
        [sys.executable, '-c', code], capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr[-4000:]
