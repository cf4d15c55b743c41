"""tools/analysis/benchmark_ops.py --inference: a row per shape, each
ratio that of its two times (the aggregation's layouts, the fused op against
the span convolution and aggregation)."""

import re
import sys

from tool_utils import load_tool


def _rows(monkeypatch, capsys, flag, pattern, **tables):
    """The tool and the matches of ``pattern`` in what
    ``benchmark_ops.py flag --repeat 1`` prints, its lists ``tables``
    replaced."""
    tool = load_tool('analysis/benchmark_ops')
    for name, value in tables.items():
        monkeypatch.setattr(tool, name, value)
    monkeypatch.setattr(sys, 'argv', ['benchmark_ops', flag, '--repeat', '1'])
    tool.main()
    return tool, re.findall(pattern, capsys.readouterr().out, re.M)


def test_inference_rows(monkeypatch, capsys):
    tool, rows = _rows(
        monkeypatch,
        capsys,
        '--inference',
        r'^\| (\d+)·(\d+)·(\d+)²·(\d+)·(\d+)' + r' \| ([\d.]+)' * 6 + r' \|$',
    )
    assert [tuple(int(v) for v in r[:5]) for r in rows] == [
        (B, C, H, tool.K, G) for B, C, H, G in tool.INFERENCE_SHAPES
    ]
    for *_, nchw, cl, ratio, unfused, fused, fused_ratio in rows:
        for num, den, shown in (
            (cl, nchw, ratio),
            (fused, unfused, fused_ratio),
        ):
            assert float(num) > 0 and float(den) > 0
            exact = float(num) / float(den)
            assert abs(float(shown) - exact) <= 0.01 + 2e-3 * exact


def test_attention_rows(monkeypatch, capsys):
    """--attention at two small stage shapes: a fused and a stock row per
    layer and shape, each ratio that of the stock and fused figures."""
    tool = load_tool('analysis/benchmark_ops')
    monkeypatch.setattr(tool, 'STAGES', [(2, 32, 28, 2), (1, 64, 14, 4)])
    monkeypatch.setattr(
        sys, 'argv', ['benchmark_ops', '--attention', '--repeat', '1']
    )
    tool.main()
    rows = re.findall(
        r'^\| (SASA|ACmix) \| (\d+)·(\d+)·(\d+)²·(\d+)·(\d+) \| (fused|stock) '
        r'\| ([\d.]+) \| ([\d.]+) \| ([\d.]+)× \| ([\d.]+)× \|$',
        capsys.readouterr().out,
        re.M,
    )
    heads = {'SASA': lambda C: C // 16, 'ACmix': lambda C: 4}
    assert [(r[0], tuple(int(v) for v in r[1:6]), r[6]) for r in rows] == [
        (layer, (B, C, H, tool.K, heads[layer](C)), path)
        for layer in ('SASA', 'ACmix')
        for B, C, H, _ in tool.STAGES
        for path in ('fused', 'stock')
    ]
    for fused, stock in zip(rows[::2], rows[1::2], strict=True):
        assert fused[-2:] == ('1.00', '1.00')
        for col, ratio in ((7, -2), (8, -1)):
            f, s = float(fused[col]), float(stock[col])
            # the figures are rounded to 0.1, the ratio to 0.01
            slack = 0.01 + s / f * (0.05 / s + 0.05 / f)
            assert abs(float(stock[ratio]) - s / f) <= slack
        # the fused op never writes the weights: less memory
        assert float(stock[8]) > float(fused[8])


def _ratio_rows(monkeypatch, capsys, flag, table, shapes, label):
    """The shape labels of the rows ``benchmark_ops.py flag --repeat 1``
    prints at ``shapes`` (its list ``table``), each row's ratios (after
    each pair of times: forward, forward + backward, ...) checked to be
    those of its times; and the number of ratios a row has."""
    tool = load_tool('analysis/benchmark_ops')
    monkeypatch.setattr(tool, table, shapes)
    monkeypatch.setattr(sys, 'argv', ['benchmark_ops', flag, '--repeat', '1'])
    tool.main()
    labels, widths = [], set()
    for line in capsys.readouterr().out.splitlines():
        head = re.match(rf'^\| ({label}) \|', line)
        if not head:
            continue
        labels.append(head[1])
        triples = re.findall(r' ([\d.]+) \| ([\d.]+) \| ([\d.]+)× \|', line)
        widths.add(len(triples))
        for a, b, ratio in triples:
            a, b = float(a), float(b)
            # the figures are rounded to 0.01, the ratio to 0.01
            slack = 0.01 + a / max(b, 0.005) * (
                0.005 / max(a, 0.005) + 0.005 / max(b, 0.005)
            )
            assert b > 0 and abs(float(ratio) - a / b) <= slack
    assert len(widths) == 1
    return labels, widths.pop()


def test_acmix_conv_rows(monkeypatch, capsys):
    """--acmix-conv at two small shapes: a row per shape, each ratio that
    of its two times."""
    labels, ratios = _ratio_rows(
        monkeypatch,
        capsys,
        '--acmix-conv',
        'ACMIX_CONV_SHAPES',
        [(64, 9, 1), (32, 8, 2)],
        r'\d+·\d+²·\d+',
    )
    assert labels == ['64·9²·1', '32·8²·2'] and ratios == 2


def test_batch_norm_rows(monkeypatch, capsys):
    """--batch-norm at two small shapes: a row per shape, each ratio that
    of its two times (the BN's forward and step, with the ReLU, with the
    residual and the ReLU)."""
    labels, ratios = _ratio_rows(
        monkeypatch,
        capsys,
        '--batch-norm',
        'BATCH_NORM_SHAPES',
        [(8, 16), (16, 12)],
        r'\d+·\d+²',
    )
    assert labels == ['8·16²', '16·12²'] and ratios == 4


def test_avg_pool_rows(monkeypatch, capsys):
    """--avg-pool at two small maps: a row per map, each ratio that of its
    two times (forward, forward + backward)."""
    labels, ratios = _ratio_rows(
        monkeypatch,
        capsys,
        '--avg-pool',
        'AVG_POOL_SHAPES',
        [(8, 16), (16, 6)],
        r'\d+·\d+²',
    )
    assert labels == ['8·16²', '16·6²'] and ratios == 2


def test_conv1x1_inference_rows(monkeypatch, capsys):
    """--conv1x1-inference at two small shapes: a row per shape and batch
    (1 and 4) with its pixel count, each ratio that of its times."""
    _, rows = _rows(
        monkeypatch,
        capsys,
        '--conv1x1-inference',
        r'^\| (\d+)·(\d+)·(\d+)·(\d+)² \| (\d+) \| ([\d.]+) \| ([\d.]+) \| '
        r'([\d.]+) \| ([\d.]+) \| ([\d.]+) \|$',
        CONV1X1_SHAPES=[(64, 96, 5), (128, 64, 3)],
    )
    assert [tuple(int(v) for v in r[:5]) for r in rows] == [
        (B, C, C_out, H, B * H * H)
        for B in (1, 4)
        for C, C_out, H in [(64, 96, 5), (128, 64, 3)]
    ]
    for *_, onednn, matmul, conv1x1, r_matmul, r_conv1x1 in rows:
        o = float(onednn)
        assert o > 0
        for t, ratio in (
            (float(matmul), r_matmul),
            (float(conv1x1), r_conv1x1),
        ):
            # the times are rounded to 0.001, the ratios to 0.01
            lo = (t - 0.0005) / (o + 0.0005) - 0.005
            hi = (t + 0.0005) / max(o - 0.0005, 1e-9) + 0.005
            assert lo <= float(ratio) <= hi
