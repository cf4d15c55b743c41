"""Hooks fire on the CPU fast paths exactly as on the stock graph.

A fast path steps aside while a hook would see one of the module calls it
skips (``mmevo.layers.fastpath.has_hooks``). For every backbone and layer,
forward pre-hooks and forward hooks on every submodule, and full backward
hooks on every conv and linear layer, count their calls, with the fast
paths on (the default) and off: the counts per submodule are equal, and so
are the outputs. Without hooks the fast
paths still run (``tests/fastpath_helpers.py`` counts the convs).
"""

import collections
import threading

import pytest
import torch
from torch import nn

from mmevo.layers import (
    ELSA,
    ACmix,
    DynamicFilter,
    EvolutionConv,
    Involution,
    LocalSelfAttention,
    set_cpu_fastpath,
)
from mmevo.layers.fastpath import has_hooks
from mmevo.models import (
    ACmixResNet,
    ACmixSwinTransformer,
    ELSASwinTransformer,
    RedNet,
)
from mmevo.models.backbones.bottleneck import MiddleLayerBottleneck

import fastpath_helpers as helpers

SWIN = dict(
    embed_dims=16,
    depths=(1, 2, 1, 1),
    num_heads=(2, 2, 4, 4),
    drop_path_rate=0,
)
# name: (build, input channels, input size)
MODELS = {
    'rednet': (lambda: RedNet(26, stem_channels=32, base_channels=16), 3, 32),
    'rednet_with_cp': (
        lambda: RedNet(26, stem_channels=32, base_channels=16, with_cp=True),
        3,
        32,
    ),
    'acmix_resnet': (
        lambda: ACmixResNet(26, stem_channels=16, base_channels=16),
        3,
        32,
    ),
    'elsa_swin': (lambda: ELSASwinTransformer(**SWIN), 3, 32),
    'acmix_swin': (lambda: ACmixSwinTransformer(**SWIN), 3, 32),
    'involution_s2': (lambda: Involution(16, 3, 2), 16, 9),
    'acmix': (lambda: ACmix(8, 8, 5, 2), 8, 9),
    'elsa_additive': (lambda: ELSA(24, 3, kernel_size=5, lam=0), 24, 9),
    'elsa': (lambda: ELSA(24, 2, kernel_size=3, stride=2), 24, 9),
    'local_self_attention': (
        lambda: LocalSelfAttention(8, num_heads=2, kernel_size=3),
        8,
        9,
    ),
    'dynamic_filter': (lambda: DynamicFilter(8, stride=2), 8, 9),
    'evolution_conv': (lambda: EvolutionConv(8, 3, stride=2), 8, 9),
}


def _hooked_run(model, x, fast):
    """Calls of every submodule's forward pre-hook and forward hook, and
    of every conv's and linear's full backward hook, in a train step; and
    the outputs."""
    counts = collections.Counter()
    handles = []
    for name, m in model.named_modules():
        handles += [
            m.register_forward_pre_hook(
                lambda mod, i, n=name: counts.update([('pre', n)])
            ),
            m.register_forward_hook(
                lambda mod, i, o, n=name: counts.update([('fwd', n)])
            ),
        ]
        if getattr(m, 'inplace', False) is True:
            # torch refuses a full backward hook on a module whose output is
            # then changed in place: the activations run out of place here
            m.inplace = False
        if isinstance(m, (nn.Conv2d, nn.Linear)):
            # the modules a fast path may skip (the norms' outputs are
            # changed in place by the residual adds)
            handles.append(
                m.register_full_backward_hook(
                    lambda mod, gi, go, n=name: counts.update([('bwd', n)])
                )
            )
    set_cpu_fastpath(model, fast)
    try:
        outs = model(x.clone().requires_grad_())
        outs = outs if isinstance(outs, tuple) else (outs,)
        sum(o.sum() for o in outs).backward()
    finally:
        set_cpu_fastpath(model, True)
        for handle in handles:
            handle.remove()
    return counts, outs


@pytest.mark.parametrize('name', sorted(MODELS))
def test_every_hook_fires_as_on_the_stock_path(name):
    build, channels, size = MODELS[name]
    torch.manual_seed(0)
    model = helpers.randomised(build()).double().train()
    x = torch.randn(2, channels, size, size + 3).double()
    state = {k: v.clone() for k, v in model.state_dict().items()}
    fast, fast_outs = _hooked_run(model, x, True)
    model.load_state_dict(state)
    stock, stock_outs = _hooked_run(model, x, False)
    assert fast == stock
    # every layer ran as a module (containers such as ModuleLists are
    # never called)
    called = {n for kind, n in stock if kind == 'fwd'}
    layers = (nn.Conv2d, nn.Linear, nn.modules.batchnorm._NormBase)
    assert '' in called
    assert called >= {
        n for n, m in model.named_modules() if isinstance(m, layers)
    }
    for a, b in zip(fast_outs, stock_outs, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-10)


def test_one_hook_deep_inside_fires_and_the_rest_stays_fast():
    """A forward hook on one involution's span conv: it fires once per call,
    as on the stock graph, and the blocks without hooks keep their fast
    path (fewer conv module calls than the stock graph)."""
    torch.manual_seed(0)
    model = RedNet(26, stem_channels=32, base_channels=16).eval()
    target = model.layer3[0].conv2.conv2.conv
    seen = []
    target.register_forward_hook(lambda m, i, o: seen.append(o.shape))
    calls = helpers.count_conv_calls(model)
    x = torch.randn(1, 3, 32, 32)
    with torch.no_grad():
        out = model(x)
    fast_calls = len(calls)
    assert len(seen) == 1
    del calls[:]
    with torch.no_grad():
        ref = set_cpu_fastpath(model, False)(x)
    helpers.uncount_conv_calls(model)
    assert len(seen) == 2 and seen[0] == seen[1]
    assert fast_calls < len(calls)
    for a, b in zip(out, ref, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_a_global_module_hook_sees_every_call():
    """``register_module_forward_hook`` sees every module call of the fast
    path too."""
    torch.manual_seed(0)
    model = ACmixResNet(26, stem_channels=16, base_channels=16).eval()
    x = torch.randn(1, 3, 32, 32)
    for fast in (True, False):
        seen = collections.Counter()
        handle = nn.modules.module.register_module_forward_hook(
            lambda m, i, o, seen=seen: seen.update([id(m)])
        )
        try:
            with torch.no_grad():
                set_cpu_fastpath(model, fast)(x)
        finally:
            handle.remove()
        if fast:
            fast_seen = seen
    set_cpu_fastpath(model, True)
    assert fast_seen == seen
    assert set(seen) == {id(m) for m in model.modules()}


def test_has_hooks_sees_each_kind_of_hook():
    block = nn.Sequential(
        nn.Conv2d(2, 2, 1), nn.Sequential(nn.Conv2d(2, 2, 1))
    )
    inner = block[1][0]
    assert not has_hooks(block)
    module_hooks = nn.modules.module
    for register, is_global in (
        (lambda: inner.register_forward_pre_hook(lambda m, i: None), False),
        (lambda: inner.register_forward_hook(lambda m, i, o: None), False),
        (
            lambda: inner.register_full_backward_hook(lambda m, gi, go: None),
            False,
        ),
        (
            lambda: inner.register_full_backward_pre_hook(lambda m, go: None),
            False,
        ),
        (
            lambda: module_hooks.register_module_forward_hook(
                lambda m, i, o: None
            ),
            True,
        ),
        (
            lambda: module_hooks.register_module_full_backward_hook(
                lambda m, gi, go: None
            ),
            True,
        ),
    ):
        handle = register()
        assert has_hooks(block)
        # a sibling without hooks is free of them, unless they are global
        assert has_hooks(block[0]) == is_global
        handle.remove()
        assert not has_hooks(block)


class _Gate(nn.Module):
    """A middle layer (identity) that, once armed, raises or waits for an
    event: a call held inside its block's fast path."""

    def __init__(self):
        super().__init__()
        self.entered, self.release = threading.Event(), threading.Event()
        self.fail = False

    def forward(self, x):
        if self.fail:
            raise ValueError('gate closed')
        self.entered.set()
        assert self.release.wait(60)
        return x


def _gated_block():
    gate = _Gate()
    block = MiddleLayerBottleneck(16, 4, lambda c, s, d: gate).eval()
    return block, gate


def _conv1_calls(block):
    seen = []
    block.conv1.register_forward_hook(lambda m, i, o: seen.append(o.shape))
    return seen


def test_a_hook_added_after_a_failed_fast_call_fires():
    """A block's fast path that raised (here its middle layer) leaves no
    trace: a hook registered afterwards on ``conv1``, which the fast path
    does not call as a module, makes the next call step aside."""
    block, gate = _gated_block()
    gate.fail = True
    x = torch.randn(1, 16, 5, 5)
    with pytest.raises(ValueError, match='gate closed'):
        block(x)
    gate.fail = False
    gate.release.set()
    seen = _conv1_calls(block)
    with torch.no_grad():
        block(x)
    assert seen == [torch.Size([1, 4, 5, 5])]


def test_a_fast_call_on_another_thread_does_not_hide_hooks():
    """While one thread is inside a block's fast path, a hooked block
    called on another thread still steps aside: what a fast path has ruled
    out holds for its own thread only."""
    busy, gate = _gated_block()
    hooked, hooked_gate = _gated_block()
    hooked_gate.release.set()
    seen = _conv1_calls(hooked)
    x = torch.randn(1, 16, 5, 5)
    worker = threading.Thread(target=busy, args=(x,))
    worker.start()
    try:
        assert gate.entered.wait(60)
        with torch.no_grad():
            hooked(x)
    finally:
        gate.release.set()
        worker.join(60)
    assert seen == [torch.Size([1, 4, 5, 5])]
