"""tools/analysis/benchmark_ops.py --inference: a row per shape, each
ratio that of its two times."""

import re
import sys

from tool_utils import load_tool


def test_inference_rows(monkeypatch, capsys):
    tool = load_tool('analysis/benchmark_ops')
    monkeypatch.setattr(
        sys, 'argv', ['benchmark_ops', '--inference', '--repeat', '1']
    )
    tool.main()
    rows = re.findall(
        r'^\| (\d+)·(\d+)·(\d+)²·(\d+)·(\d+) \| ([\d.]+) \| ([\d.]+) \| '
        r'([\d.]+) \|$',
        capsys.readouterr().out,
        re.M,
    )
    assert [tuple(int(v) for v in r[:5]) for r in rows] == [
        (B, C, H, tool.K, G) for B, C, H, G in tool.INFERENCE_SHAPES
    ]
    for *_, nchw, cl, ratio in rows:
        assert float(nchw) > 0 and float(cl) > 0
        assert abs(float(ratio) - float(cl) / float(nchw)) <= 0.01 + 2e-3 * (
            float(cl) / float(nchw)
        )
