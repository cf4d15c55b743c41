"""tools/deployment on exports that do not fit the config and outputs they
must not or cannot write: aoti_test.py and onnx_test.py refuse, before the
evaluation loop and in one line, an export of another fixed size or of
another class count; the exporters refuse, before the export, an --out
that is one of their inputs or cannot be written; pytorch2onnx --dynamic
checks the graph at a second size and names --dynamic when it fails.

Slow (about 2 minutes on 2 cores): an AOTInductor compile of a small
network, two ONNX exports of the demo detector and one of a narrow
ACmix-Swin classifier.
"""

import os
import os.path as osp
import re
import subprocess
import sys

import onnx
import pytest
import torch
from mmengine.runner import Runner
from onnx import TensorProto, helper

from mmevo.apis import build_model, load_config
from mmevo.demo import make_synthetic_coco
from mmevo.deploy import TensorOutputs, export_aoti, exportable

pytestmark = pytest.mark.slow

# the tool tests' helpers (tests/tools/tool_utils.py)
sys.path.insert(
    0, osp.join(osp.dirname(osp.dirname(osp.abspath(__file__))), 'tools')
)
from tool_utils import DEMO_DET, REPO, load_tool  # noqa: E402

CONFIG = """
_base_ = '{base}'
data_root = '{root}/'
test_dataloader = dict(
    batch_size=1, num_workers=0, persistent_workers=False,
    dataset=dict(data_root=data_root))
test_evaluator = dict(ann_file=data_root + 'annotations/instances_val.json')
"""
TEST_SIZE = 128  # the demo resizes every test image to 128 x 128


@pytest.fixture(scope='module')
def setup(tmp_path_factory):
    """A tiny set, the demo detector's config on it and a checkpoint."""
    tmp = tmp_path_factory.mktemp('exports_fit')
    root = str(tmp / 'coco')
    make_synthetic_coco(root, num_train=1, num_val=2, img_size=64)
    cfg = str(tmp / 'cfg.py')
    with open(cfg, 'w') as f:
        f.write(CONFIG.format(base=DEMO_DET, root=root))
    torch.manual_seed(0)
    model = build_model(load_config(cfg))
    ckpt = str(tmp / 'model.pth')
    torch.save({'state_dict': model.state_dict()}, ckpt)
    return tmp, cfg, ckpt


@pytest.fixture
def no_evaluation(monkeypatch):
    """Fail the test if the evaluation loop starts."""

    def test(self):
        raise AssertionError('the evaluation loop ran')

    monkeypatch.setattr(Runner, 'test', test)


def output_shapes(cfg, size, **bbox_head):
    """The raw outputs' shapes of the config's detector (its head changed
    by ``bbox_head``) at a ``size`` x ``size`` input."""
    cfg = load_config(cfg)
    cfg.model.bbox_head.update(bbox_head)
    model, _ = exportable(build_model(cfg).eval())
    with torch.no_grad():
        outs = model(torch.zeros(1, 3, size, size))
    return [list(t.shape) for t in outs]


def constant_graph(path, size, shapes):
    """An ONNX model of a ``size`` x ``size`` input whose outputs are zeros
    of ``shapes``: an export's interface without its work."""
    nodes, outputs = [], []
    for i, shape in enumerate(shapes):
        nodes += [
            helper.make_node(
                'Constant',
                [],
                [f'shape{i}'],
                value=helper.make_tensor(
                    f's{i}', TensorProto.INT64, [len(shape)], shape
                ),
            ),
            helper.make_node('ConstantOfShape', [f'shape{i}'], [f'out{i}']),
        ]
        outputs.append(
            helper.make_tensor_value_info(f'out{i}', TensorProto.FLOAT, shape)
        )
    graph = helper.make_graph(
        nodes,
        'interface',
        [
            helper.make_tensor_value_info(
                'input', TensorProto.FLOAT, [1, 3, size, size]
            )
        ],
        outputs,
    )
    # the IR and opset of the exporter's models
    model = helper.make_model(
        graph, ir_version=8, opset_imports=[helper.make_opsetid('', 18)]
    )
    onnx.save(model, path)
    return path


def one_line_error(capsys, tool, argv):
    with pytest.raises(SystemExit) as info:
        load_tool(f'deployment/{tool}').main(argv)
    assert info.value.code == 1
    # torch's own log lines (e.g. 'W1203 ... No CUDA runtime is found')
    lines = [
        line
        for line in capsys.readouterr().err.splitlines()
        if not re.match(r'[DIWE]\d{4} ', line)
    ]
    assert len(lines) == 1 and lines[0].startswith('error: '), lines
    return lines[0][len('error: ') :]


def evaluation_args(tmp, name):
    return [
        '--work-dir',
        str(tmp / name),
        '--cfg-options',
        f'experiment_name={name}',
        f'visualizer.name={name}',
    ]


def mismatch(what, size):
    return (
        f"the test pipeline's images do not fit: {what}, got (1, 3, "
        f'{TEST_SIZE}, {TEST_SIZE}) float32 on cpu: height {TEST_SIZE}, '
        f'expected {size}; width {TEST_SIZE}, expected {size}; it was '
        'exported for one size: export it at this size (--shape '
        f'{TEST_SIZE} {TEST_SIZE}), or with dynamic sizes (--dynamic)'
    )


def test_aoti_test_refuses_a_package_of_another_size(
    setup, capsys, no_evaluation
):
    """A 64 x 64 package on the 128 x 128 test pipeline (it would read out
    of bounds and score garbage): one line before the loop."""
    tmp, cfg, _ = setup
    torch.manual_seed(0)
    net = torch.nn.Conv2d(3, 4, 3, padding=1).eval()
    package = str(tmp / 'conv64.pt2')
    export_aoti(
        TensorOutputs(net, lambda m, x: m(x)),
        torch.randn(1, 3, 64, 64),
        package,
        dynamic=False,
    )
    message = one_line_error(
        capsys, 'aoti_test', [cfg, package, *evaluation_args(tmp, 'aoti')]
    )
    what = f"AOTInductor package '{package}' takes (1, 3, 64, 64) float32"
    what += ' on cpu'
    assert message == mismatch(what, 64)


def test_onnx_test_refuses_a_graph_of_another_size(
    setup, capsys, no_evaluation
):
    tmp, cfg, _ = setup
    path = constant_graph(str(tmp / 'det64.onnx'), 64, output_shapes(cfg, 64))
    message = one_line_error(
        capsys, 'onnx_test', [cfg, path, *evaluation_args(tmp, 'onnx64')]
    )
    what = f"ONNX model '{path}' takes (1, 3, 64, 64) float32"
    assert message == mismatch(what, 64)


def test_onnx_test_refuses_a_graph_of_another_class_count(
    setup, capsys, no_evaluation
):
    tmp, cfg, _ = setup
    classes = load_config(cfg).model.bbox_head.num_classes
    ours = output_shapes(cfg, TEST_SIZE)
    theirs = output_shapes(cfg, TEST_SIZE, num_classes=classes + 2)
    first = next(
        i for i, (a, b) in enumerate(zip(theirs, ours, strict=False)) if a != b
    )
    path = constant_graph(str(tmp / 'other.onnx'), TEST_SIZE, theirs)
    message = one_line_error(
        capsys, 'onnx_test', [cfg, path, *evaluation_args(tmp, 'classes')]
    )
    assert message == (
        f"ONNX model '{path}' gives output {first} of shape "
        f"{tuple(theirs[first])} on the test pipeline's first image, the "
        f"config's model {tuple(ours[first])}: it was exported from another "
        "model (another class count?); export this config's checkpoint"
    )


@pytest.fixture
def no_export(monkeypatch):
    """The exporters' tools with a build and an export that fail the test
    if they start: what is refused must be refused before them."""
    tools = {
        name: load_tool(f'deployment/{name}')
        for name in ('pytorch2onnx', 'pytorch2aoti')
    }

    def ran(*args, **kwargs):
        raise AssertionError('the export started')

    for tool in tools.values():
        monkeypatch.setattr(tool.apis, 'build_model', ran)
    return tools


@pytest.mark.parametrize('tool', ['pytorch2onnx', 'pytorch2aoti'])
def test_an_exporter_never_writes_over_its_input(
    setup, tool, no_export, capsys
):
    tmp, cfg, ckpt = setup
    link = tmp / 'link.pth'
    if not link.exists():
        link.symlink_to(ckpt)
    before = open(ckpt, 'rb').read()
    for out, name, source in [
        (ckpt, 'checkpoint', ckpt),
        (str(link), 'checkpoint', ckpt),
        (cfg, 'config', cfg),
    ]:
        with pytest.raises(SystemExit) as info:
            no_export[tool].main([cfg, ckpt, '--out', out])
        assert info.value.code == 1
        err = capsys.readouterr().err
        assert err == (
            f"error: --out '{out}' is the {name} '{source}': the tool "
            'would write over its own input; choose another output file\n'
        )
    assert open(ckpt, 'rb').read() == before


@pytest.mark.parametrize('tool', ['pytorch2onnx', 'pytorch2aoti'])
def test_an_exporter_checks_its_output_before_the_export(
    setup, tool, no_export, capsys
):
    tmp, cfg, ckpt = setup
    ext = '.onnx' if tool == 'pytorch2onnx' else '.pt2'
    cases = {
        f'{ckpt}/m{ext}': f"'{ckpt}' is a file, not a folder; choose "
        'another output folder',
        f'/proc/mmevo/m{ext}': "cannot write in the folder '/proc' (",
    }
    if tool == 'pytorch2onnx':
        cases['/dev/full'] = 'is not a regular file (a device or a pipe)'
    else:
        # the package format: refused before the compile, not after it
        cases[str(tmp / 'x.pth')] = 'must end with .pt2 (e.g. x.pt2)'
    for out, reason in cases.items():
        with pytest.raises(SystemExit) as info:
            no_export[tool].main([cfg, ckpt, '--out', out])
        assert info.value.code == 1
        err = capsys.readouterr().err
        assert err.startswith(f"error: --out '{out}'") and reason in err
        assert err.count('\n') == 1


def test_pytorch2onnx_dynamic_checks_a_second_size(setup, monkeypatch, capsys):
    """A --dynamic export whose graph fixed the sizes (what torch.onnx's
    fallback to a fixed-size mode gives) is an error naming --dynamic,
    and --out is not written; a truly dynamic graph passes at both sizes
    and is written (into a folder the tool creates)."""
    tmp, cfg, ckpt = setup
    tool = load_tool('deployment/pytorch2onnx')
    export = tool.export_onnx
    out = tmp / 'new' / 'det.onnx'
    argv = [cfg, ckpt, '--out', str(out), '--shape', '64', '64']
    argv += ['--dynamic', '--exporter', 'torchscript']

    def fixed_sizes(*args, **kwargs):
        return export(*args, **dict(kwargs, dynamic=False))

    monkeypatch.setattr(tool, 'export_onnx', fixed_sizes)
    with pytest.raises(SystemExit) as info:
        tool.main(argv)
    assert info.value.code == 1
    err = capsys.readouterr().err
    # 64 x 64 exported; the second size is 3/4 and 5/4 of it, odd
    assert err == (
        'error: --dynamic: the onnxruntime graph does not take another size '
        "than the export's: at (1, 3, 49, 81): height 49, expected 64; "
        'width 81, expected 64; the exporter fixed the sizes: export this '
        'model without --dynamic, at the size it runs\n'
    )
    assert not out.exists() and os.listdir(out.parent) == []

    monkeypatch.setattr(tool, 'export_onnx', export)
    assert tool.main(argv) == str(out)
    printed = capsys.readouterr().out
    for shape in ['(1, 3, 64, 64)', '(1, 3, 49, 81)']:
        assert f'[export] {shape}: onnxruntime vs PyTorch' in printed
    assert os.listdir(out.parent) == ['det.onnx']


ACMIX_SWIN = """
_base_ = '{base}'
model = dict(
    backbone=dict(
        embed_dims=16, depths=(1, 1, 1, 1), num_heads=(1, 2, 4, 8),
        drop_path_rate=0.0),
    head=dict(in_channels=128, num_classes=10))
"""


def test_pytorch2onnx_dynamic_refuses_an_acmix_swin_graph_of_one_size(
    tmp_path,
):
    """The case of the report: torch.onnx exports a narrow ACmix-Swin
    classifier with --dynamic through a mode that fixes the window
    reshapes, which onnxruntime runs at the export size only. Slow (about
    90 s on 2 cores): torch.export traces the model twice (non-strict
    fails, strict passes)."""
    cfg = tmp_path / 'acmix_swin.py'
    base = osp.join(
        osp.dirname(DEMO_DET),
        '..',
        'acmix_swin',
        'acmix-swin-tiny_8xb128_in1k.py',
    )
    cfg.write_text(ACMIX_SWIN.format(base=osp.abspath(base)))
    torch.manual_seed(0)
    ckpt = tmp_path / 'c.pth'
    state = build_model(load_config(str(cfg))).state_dict()
    torch.save({'state_dict': state}, ckpt)
    out = tmp_path / 'c.onnx'
    argv = [str(cfg), str(ckpt), '--out', str(out), '--shape', '112', '112']
    # a fresh process, as a user runs it: the long export logs through
    # handlers that earlier in-process tools may have bound to stderr
    proc = subprocess.run(
        [
            sys.executable,
            osp.join(REPO, 'tools', 'deployment', 'pytorch2onnx.py'),
            *argv,
            '--dynamic',
        ],
        env=dict(os.environ, PYTHONPATH=REPO),
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert proc.returncode == 1, proc.stderr[-3000:]
    lines = [
        line
        for line in proc.stderr.splitlines()
        if not re.match(r'[DIWE]\d{4} ', line)
    ]
    assert len(lines) == 1 and lines[0].startswith('error: '), lines
    message = lines[0][len('error: ') :]
    # 112 x 112 exported and checked; the second size is 85 x 141
    assert message.startswith(
        '--dynamic: the onnxruntime graph does not take another size than '
        "the export's: fails at input (1, 3, 85, 141): "
    )
    assert message.endswith(
        '; the exporter fixed the sizes: export this model without '
        '--dynamic, at the size it runs'
    )
    assert not out.exists()
    assert sorted(os.listdir(tmp_path)) == ['acmix_swin.py', 'c.pth']
