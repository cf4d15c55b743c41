"""tools/analysis/benchmark_onnx.py: eager RedNet-50 timed as it runs by
default and with ``MMEVO_CONV1X1=onednn`` in the same rounds."""

import os
import re

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
