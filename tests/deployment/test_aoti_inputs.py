"""AotiModel (mmevo/deploy/aoti.py) checks every input against what the
package recorded: a wrong rank, batch, dtype, another size than a static
package's, a size below a dynamic package's bound is a ValueError naming
the expected and the given (the package would return garbage or read out
of bounds); channels-last and sliced inputs give the results of the
contiguous input; two threads calling one package get the results of one
thread and do not hang.

Slow (about 40 s on 2 cores): compiles two AOTInductor packages (static
and dynamic sizes) of a convolution and an involution, which the tests
share.
"""

import os
import subprocess
import sys
import warnings

import pytest
import torch

from mmevo.deploy import AotiModel, TensorOutputs, export_aoti
from mmevo.layers import Involution

pytestmark = pytest.mark.slow

REPO = os.path.dirname(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
)
H, W = 16, 20  # the example size, not square: height and width apart


def layers():
    torch.manual_seed(0)
    net = torch.nn.Sequential(
        torch.nn.Conv2d(3, 16, 3, padding=1),
        Involution(16, 3, group_channels=8),
    )
    return TensorOutputs(net.eval(), lambda m, x: m(x))


@pytest.fixture(scope='module')
def packages(tmp_path_factory):
    """``{'static': path, 'dynamic': path}`` and the eager model."""
    tmp = tmp_path_factory.mktemp('aoti_inputs')
    model = layers()
    x = torch.randn(1, 3, H, W)
    paths = {}
    for kind in ('static', 'dynamic'):
        paths[kind] = str(tmp / f'{kind}.pt2')
        export_aoti(model, x, paths[kind], dynamic=kind == 'dynamic')
    return paths, model


def assert_close(outputs, expected):
    assert len(outputs) == len(expected)
    for out, ref in zip(outputs, expected, strict=True):
        assert out.shape == ref.shape
        err = (out - ref).abs().max() / ref.abs().max()
        assert err <= 1e-4, float(err)


@pytest.mark.parametrize('kind', ['static', 'dynamic'])
def test_layouts_give_the_contiguous_results(packages, kind):
    paths, model = packages
    package = AotiModel(paths[kind])
    torch.manual_seed(1)
    x = torch.randn(1, 3, H, W)
    with torch.no_grad():
        expected = model(x)
    channels_last = x.contiguous(memory_format=torch.channels_last)
    sliced = torch.randn(1, 3, H + 3, 2 * W)[:, :, 2 : H + 2, ::2]
    assert not channels_last.is_contiguous() and not sliced.is_contiguous()
    assert_close(package(channels_last), expected)
    with torch.no_grad():
        assert_close(package(sliced), model(sliced.contiguous()))


def test_inputs_a_static_package_cannot_take_are_refused(packages):
    paths, _ = packages
    package = AotiModel(paths['static'])
    name = f"AOTInductor package '{paths['static']}'"
    takes = f'{name} takes (1, 3, {H}, {W}) float32 on cpu, got'

    def one_size(h, w):
        return (
            f'it was exported for one size: export it at this size '
            f'(--shape {h} {w}), or with dynamic sizes (--dynamic)'
        )

    cases = [
        (
            torch.randn(2, 3, H, W),
            f'(2, 3, {H}, {W}) float32 on cpu: batch 2, expected 1; its '
            'batch is fixed at export: give 1 image(s) a call',
        ),
        (
            torch.randn(1, 3, H, W, dtype=torch.float64),
            f'(1, 3, {H}, {W}) float64 on cpu: dtype float64, expected '
            'float32',
        ),
        (
            torch.randn(1, 3, 2 * H, W),
            f'(1, 3, {2 * H}, {W}) float32 on cpu: height {2 * H}, expected '
            f'{H}; {one_size(2 * H, W)}',
        ),
        (
            torch.randn(1, 3, H - 4, W + 4),
            f'(1, 3, {H - 4}, {W + 4}) float32 on cpu: height {H - 4}, '
            f'expected {H}; width {W + 4}, expected {W}; '
            f'{one_size(H - 4, W + 4)}',
        ),
        (
            torch.randn(3, H, W),
            f'({3}, {H}, {W}) float32 on cpu: 3 dimensions, expected 4',
        ),
        (
            torch.randn(1, 3, H, W, device='meta'),
            f'(1, 3, {H}, {W}) float32 on meta: device meta, expected cpu',
        ),
    ]
    for x, problem in cases:
        with pytest.raises(ValueError) as info:
            package(x)
        assert str(info.value) == f'{takes} {problem}'
    with pytest.raises(TypeError) as info:
        package(torch.randn(1, 3, H, W).numpy())
    assert str(info.value) == (
        f'{name} takes a tensor (1, 3, {H}, {W}) float32 on cpu, got ndarray'
    )


def test_a_dynamic_package_takes_sizes_in_its_bounds_only(packages):
    paths, model = packages
    package = AotiModel(paths['dynamic'])
    assert str(package.input_spec) == '(1, 3, 2..inf, 2..inf) float32 on cpu'
    torch.manual_seed(2)
    for hw in [(13, 27), (2, 2), (41, 9)]:
        x = torch.randn(1, 3, *hw)
        with torch.no_grad():
            assert_close(package(x), model(x))
    name = f"AOTInductor package '{paths['dynamic']}'"
    for x, problem in [
        (torch.randn(1, 3, 1, 9), 'height 1, expected 2..inf'),
        (torch.randn(2, 3, 9, 9), 'batch 2, expected 1; its batch is fixed'),
        (torch.randn(1, 3, 9, 9).double(), 'dtype float64, expected float32'),
    ]:
        with pytest.raises(ValueError) as info:
            package(x)
        message = str(info.value)
        assert message.startswith(
            f'{name} takes (1, 3, 2..inf, 2..inf) float32 on cpu, got '
            f'{tuple(x.shape)}'
        )
        assert problem in message and '\n' not in message


# one package called from 2 threads, 6 calls each: the results of one thread
_THREADS = """
import sys, threading, torch
from mmevo.deploy import AotiModel
package = AotiModel(sys.argv[1])
heights, w = [int(h) for h in sys.argv[2].split(',')], int(sys.argv[3])
torch.manual_seed(0)
xs = [torch.randn(1, 3, heights[i % len(heights)], w) for i in range(6)]
expected = [package(x) for x in xs]
got = {}
def work(t):
    for i, x in enumerate(xs):
        got[t, i] = package(x)
threads = [threading.Thread(target=work, args=(t,)) for t in range(2)]
for t in threads:
    t.start()
for t in threads:
    t.join()
same = all(
    torch.equal(a, b)
    for (t, i), outs in got.items()
    for a, b in zip(outs, expected[i])
)
print('same' if same and len(got) == 12 else 'different')
"""


@pytest.mark.parametrize('kind', ['static', 'dynamic'])
def test_two_threads_get_the_results_of_one(packages, kind):
    paths, _ = packages
    heights = f'{H},{H + 1}' if kind == 'dynamic' else str(H)
    args = [sys.executable, '-c', _THREADS, paths[kind], heights, str(W)]
    try:
        out = subprocess.run(
            args,
            env=dict(os.environ, PYTHONPATH=REPO, OMP_NUM_THREADS='1'),
            capture_output=True,
            text=True,
            timeout=240,
        )
    except subprocess.TimeoutExpired:
        pytest.fail('two threads calling one AotiModel hung')
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip() == 'same'


def test_a_static_package_warns_once_on_other_threads(packages):
    """A static package's convolution weights are laid out for the thread
    count it was compiled on: called on another, it warns once (oneDNN may
    re-lay them every call); on its own, and a dynamic package (plain
    weights) on any, never."""
    paths, _ = packages
    static, dynamic = AotiModel(paths['static']), AotiModel(paths['dynamic'])
    made = static.weight_layout['threads']
    assert static.weight_layout == {'threads': made, 'size': None}
    assert dynamic.weight_layout is None
    x = torch.randn(1, 3, H, W)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(made)
        with warnings.catch_warnings():
            warnings.simplefilter('error')
            static(x)
            dynamic(x)
        torch.set_num_threads(made + 1)
        with pytest.warns(UserWarning) as record:
            static(x)
            static(x)
        assert len(record) == 1
        message = str(record[0].message)
        assert f'laid out for {made} threads' in message
        assert f'called on {made + 1} threads' in message
        with warnings.catch_warnings():
            warnings.simplefilter('error')
            dynamic(torch.randn(1, 3, H + 3, W - 1))
    finally:
        torch.set_num_threads(threads)
