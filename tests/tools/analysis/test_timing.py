"""The benchmark tools' measurements (tools/analysis/timing.py)."""

import torch
from torch import nn

from mmevo.ops import cpp_backend
from tools.analysis.timing import ops_backend, peak_memory, time_steps


def _stages():
    """A backbone-like module: a tuple of feature maps."""

    class Stages(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(3, 8, 3, padding=1)

        def forward(self, x):
            y = self.conv(x)
            return (y, y.amax(1, keepdim=True))

    return Stages()


def test_time_steps_interleaves_warmup_and_timed_steps():
    models = {'a': _stages(), 'b': _stages()}
    calls = []
    for name, model in models.items():
        model.register_forward_hook(lambda m, i, o, n=name: calls.append(n))
    times = time_steps(models, torch.randn(2, 3, 9, 7), warmup=1, iters=3)
    assert set(times) == {'a', 'b'} and all(t > 0 for t in times.values())
    assert calls == ['a', 'b'] * 4
    assert all(
        p.grad is not None for m in models.values() for p in m.parameters()
    )


def test_peak_memory_holds_the_step_s_activations():
    model = _stages()
    x = torch.randn(4, 3, 32, 32)
    # the conv's output alone: 4 x 8 x 32 x 32 fp32
    assert peak_memory(model, x) >= 4 * 8 * 32 * 32 * 4


def test_ops_backend_names_the_loaded_extension():
    name = ops_backend()
    if cpp_backend.available():
        assert name.startswith('C++ extension _ext')
    else:
        assert 'no compiled extension' in name
