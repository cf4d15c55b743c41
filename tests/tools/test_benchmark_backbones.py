"""tools/analysis/benchmark_backbones.py refuses counts it cannot use."""

import sys

import pytest

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
