"""tools/analysis/benchmark_onnx.py: eager RedNet-50 timed as it runs by
default and with ``MMEVO_CONV1X1=onednn`` in the same rounds."""

import os
import re

import pytest

from tool_utils import load_tool


def test_torch_onednn_runtime(monkeypatch, capsys):
    """``torch-onednn`` runs the model with ``MMEVO_CONV1X1=onednn`` set
    for its calls only, and its outputs are eager's to float rounding."""
    monkeypatch.delenv('MMEVO_CONV1X1', raising=False)
    tool = load_tool('analysis/benchmark_onnx')
    seen = []
    module_call = tool.torch.nn.Module.__call__

    def call(module, *args, **kwargs):
        if not seen or seen[-1] != os.environ.get('MMEVO_CONV1X1'):
            seen.append(os.environ.get('MMEVO_CONV1X1'))
        return module_call(module, *args, **kwargs)

    monkeypatch.setattr(tool.torch.nn.Module, '__call__', call)
    med = tool.main(
        [
            '--models',
            'rednet50',
            '--runtimes',
            'torch',
            'torch-onednn',
            '--size',
            '64',
            '--warmup',
            '0',
            '--iters',
            '1',
        ]
    )
    assert set(med) == {('rednet50', 'torch'), ('rednet50', 'torch-onednn')}
    assert all(ms > 0 for ms in med.values())
    # set for the calls of torch-onednn only, the rounds alternating
    assert seen[:2] == [None, 'onednn'] and set(seen) == {None, 'onednn'}
    assert os.environ.get('MMEVO_CONV1X1') is None
    out = capsys.readouterr().out
    assert re.search(r'^\| rednet50 \| [\d.]+ \| [\d.]+ \|$', out, re.M)
    err = re.search(
        r'rednet50 torch-onednn vs eager: max relative difference (\S+)', out
    )
    assert float(err[1]) < 1e-5


def test_run_size_times_the_dynamic_exports_at_another_size(
    monkeypatch, capsys
):
    """``--run-size`` and ``--run-threads`` time (and check) every runtime
    at that size and thread count, the exports made at ``--size`` on the
    threads before; the AOTInductor runtimes compile with the weights
    plain (``aoti``) or laid out for ``--size`` (``aoti-prepacked``), and
    without the fused involution (``aoti-unfused``)."""
    tool = load_tool('analysis/benchmark_onnx')
    compiled = {}

    def export_aoti(
        model, x, path, dynamic, inline_ops, prepack, fused_involution
    ):
        compiled[os.path.basename(path)] = (
            tuple(x.shape),
            dynamic,
            prepack,
            fused_involution,
        )
        assert tool.torch.get_num_threads() == threads
        return path

    def package(path):
        def run(x):
            calls.append((tuple(x.shape), tool.torch.get_num_threads()))
            return (x.sum(),)

        return run

    calls = []
    monkeypatch.setattr(tool, 'export_aoti', export_aoti)
    monkeypatch.setattr(tool, 'AotiModel', package)
    monkeypatch.setattr(
        tool, 'max_difference', lambda outputs, expected: (0.0, None)
    )
    threads = tool.torch.get_num_threads()
    try:
        med = tool.main(
            [
                '--models',
                'rednet50',
                '--runtimes',
                'aoti',
                'aoti-prepacked',
                'aoti-unfused',
                '--size',
                '64',
                '--run-size',
                '48',
                '40',
                '--run-threads',
                str(threads + 1),
                '--warmup',
                '0',
                '--iters',
                '1',
            ]
        )
    finally:
        tool.torch.set_num_threads(threads)
    assert compiled == {
        'rednet50-aoti.pt2': ((1, 3, 64, 64), True, False, True),
        'rednet50-aoti-prepacked.pt2': ((1, 3, 64, 64), True, True, True),
        'rednet50-aoti-unfused.pt2': ((1, 3, 64, 64), True, False, False),
    }
    assert {shape for shape, _ in calls} == {(1, 3, 48, 40)}
    # the timed rounds: two calls of each runtime, the second timed
    assert [n for _, n in calls[-6:]] == [threads + 1] * 6
    assert set(med) == {
        ('rednet50', runtime)
        for runtime in ('aoti', 'aoti-prepacked', 'aoti-unfused')
    }
    assert f'threads {threads + 1}, input 48 x 40' in capsys.readouterr().out


def test_run_size_and_prepacked_need_dynamic_exports(capsys):
    tool = load_tool('analysis/benchmark_onnx')
    for extra in (
        ['--run-size', '48', '40'],
        ['--runtimes', 'aoti-prepacked'],
    ):
        with pytest.raises(SystemExit) as info:
            tool.main(['--models', 'rednet50', '--static', *extra])
        assert info.value.code == 2
        assert 'without --static' in capsys.readouterr().err
