"""tools/analysis/benchmark_backbones.py refuses counts it cannot use."""

import sys

import pytest
import torch

from tool_utils import load_tool

pytestmark = pytest.mark.slow


@pytest.mark.parametrize(
    'option, value, expected',
    [
        ('--iters', '0', 'an integer >= 1, got 0'),
        ('--batch', '-1', 'an integer in [1, 1024], got -1'),
        ('--size', 'big', "an integer, got 'big'"),
        ('--warmup', '-1', 'an integer >= 0, got -1'),
    ],
)
def test_bad_counts_are_one_line_errors(
    option, value, expected, monkeypatch, capsys
):
    tool = load_tool('analysis/benchmark_backbones')
    monkeypatch.setattr(sys, 'argv', ['benchmark_backbones', option, value])
    with pytest.raises(SystemExit) as exit_info:
        tool.parse_args()
    assert exit_info.value.code == 2
    message = capsys.readouterr().err.strip().splitlines()[-1]
    assert message.endswith(f'argument {option}: expected {expected}')


def test_defaults(monkeypatch):
    tool = load_tool('analysis/benchmark_backbones')
    monkeypatch.setattr(sys, 'argv', ['benchmark_backbones'])
    args = tool.parse_args()
    assert (args.batch, args.size, args.warmup, args.iters) == (4, 224, 1, 3)


def test_hook_checks_are_timed_for_models_with_fast_paths():
    import torch

    from mmevo.models import RedNet

    tool = load_tool('analysis/benchmark_backbones')
    assert tool.hook_checks(torch.nn.Conv2d(3, 3, 1), 1.0) == ''
    text = tool.hook_checks(RedNet(26, stem_channels=32, base_channels=16), 1)
    ms, share = text.split('hook checks ')[1].split(' ms a forward (')
    assert 0 < float(ms) < 1000 * 1.0
    assert share.endswith('% of the step)')


def _small_models():
    from mmdet.models.backbones import ResNet

    from mmevo.models import RedNet

    torch.manual_seed(0)
    models = {
        'resnet50': ResNet(18, base_channels=8),
        'rednet50': RedNet(26, stem_channels=32, base_channels=16),
    }
    for model in models.values():
        model.eval()  # mmdet's ResNet.train returns None: no chaining
    return models


def test_stages_chain_to_the_backbone_outputs():
    """The stem and the residual stages, run in turn, are the backbone:
    each stage's output is the backbone's output of that stage."""
    tool = load_tool('analysis/benchmark_backbones')
    x = torch.randn(2, 3, 37, 45)
    for model in _small_models().values():
        parts = tool.stages(model)
        assert [n for n, _ in parts] == ['stem', *model.res_layers]
        with torch.no_grad():
            expected = model(x)
            outs, t = [], x
            for _, part in parts:
                t = part(t)
                outs.append(t)
        assert len(expected) == 4
        for got, want in zip(outs[1:], expected, strict=True):
            torch.testing.assert_close(got, want)


def test_stage_table_has_every_stage_and_the_ratios(capsys):
    tool = load_tool('analysis/benchmark_backbones')
    models = _small_models()
    for model in models.values():
        model.train()
    times = tool.stage_times(models, torch.randn(2, 3, 32, 32), 0, 1)
    stages = ['stem', 'layer1', 'layer2', 'layer3', 'layer4']
    for name in models:
        assert list(times[name]) == stages
        assert all(t > 0 for t in times[name].values())
    tool.print_stage_table(times)
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0] == (
        '| stage | resnet50 (ms) | rednet50 (ms) | / resnet50 |'
    )
    assert [line.split(' | ')[0] for line in lines[2:]] == [
        f'| {s}' for s in [*stages, 'total']
    ]
    total = lines[-1].split(' | ')
    red, ref = times['rednet50'], times['resnet50']
    ratio = sum(red.values()) / sum(ref.values())
    assert total[3] == f'{ratio:.2f}x |'


def test_stages_need_the_mmdet_builder(monkeypatch, capsys):
    tool = load_tool('analysis/benchmark_backbones')
    argv = ['benchmark_backbones', '--stages', '--builder', 'torchvision']
    monkeypatch.setattr(sys, 'argv', argv)
    with pytest.raises(SystemExit) as exit_info:
        tool.parse_args()
    assert exit_info.value.code == 2
    assert (
        capsys.readouterr()
        .err.strip()
        .endswith('--stages needs --builder mmdet')
    )


def test_resnet50_fastpath_is_mmdet_resnet50():
    """The reference on mmevo's fast paths holds mmdet's ResNet-50: the same
    keys and shapes, and with the same weights the same outputs."""
    tool = load_tool('analysis/benchmark_backbones')
    ref, fast = tool.build('resnet50'), tool.build('resnet50_fastpath')
    shapes = {k: v.shape for k, v in ref.state_dict().items()}
    assert {k: v.shape for k, v in fast.state_dict().items()} == shapes
    fast.load_state_dict(ref.state_dict())
    ref, fast = ref.double(), fast.double()
    x = torch.randn(1, 3, 45, 37, dtype=torch.float64)
    for a, b in zip(ref(x), fast(x), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)
