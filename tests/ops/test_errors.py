"""Every documented bad input raises ValueError/TypeError naming the
argument: through the public functions, through the raw ``torch.ops.mmevo``
operators on every backend and in their fake kernels, and from the C++
operators alone (a process that only loaded the library)."""

import json
import os
import re
import subprocess
import sys

import pytest
import torch

from mmevo.ops import (
    cpp_backend,
    evolution_aggregate,
    library,
    local_attention_weights,
    local_correlation,
)


def x_w(C=8, H=9, W=11, G=2, K=3, Ho=None, Wo=None, dtype=torch.float32):
    return (
        torch.randn(2, C, H, W, dtype=dtype),
        torch.randn(2, G, K, K, Ho or H, Wo or W, dtype=dtype),
    )


def test_input_not_4d():
    _, w = x_w()
    with pytest.raises(
        ValueError, match=r'input must be \(B, C, H, W\), got \(8, 9, 11\)'
    ):
        evolution_aggregate(torch.randn(8, 9, 11), w)


def test_kernel_wrong_rank():
    x, _ = x_w()
    with pytest.raises(
        ValueError,
        match=r'kernel must be \(B, G, K, K, H_out, W_out\), '
        r'got \(2, 2, 9, 9, 11\)',
    ):
        evolution_aggregate(x, torch.randn(2, 2, 9, 9, 11))


def test_kernel_window_dims_differ():
    x, _ = x_w()
    with pytest.raises(
        ValueError,
        match=r'same K in both window dims, got \(2, 2, 3, 5, 9, 11\)',
    ):
        evolution_aggregate(x, torch.randn(2, 2, 3, 5, 9, 11))


def test_channels_not_divisible_by_groups():
    x, w = x_w(C=8, G=3)
    with pytest.raises(
        ValueError,
        match=r'input channels \(8\) must be divisible by the '
        r'kernel groups G=3',
    ):
        evolution_aggregate(x, w)


def test_kernel_output_height_mismatch():
    x, w = x_w(Ho=8)
    with pytest.raises(
        ValueError,
        match=r'kernel must be .* = \(2, 2, 3, 3, 9, 11\) for input '
        r'\(2, 8, 9, 11\), got \(2, 2, 3, 3, 8, 11\)',
    ):
        evolution_aggregate(x, w)


def test_kernel_output_width_mismatch():
    x, w = x_w(Wo=6)
    # stride 2 on 9 x 11 gives 5 x 6: the expectation accounts for the
    # stride.
    with pytest.raises(
        ValueError,
        match=r'= \(2, 2, 3, 3, 9, 11\) .* got \(2, 2, 3, 3, 9, 6\)',
    ):
        evolution_aggregate(x, w)
    evolution_aggregate(x, torch.randn(2, 2, 3, 3, 5, 6), stride=2)


def test_dtype_mismatch():
    x, w = x_w()
    with pytest.raises(
        TypeError,
        match=r'input and kernel must have the same dtype, got '
        r'torch.float32 and torch.float64',
    ):
        evolution_aggregate(x, w.double())


def test_device_mismatch():
    x, _w = x_w()
    with pytest.raises(
        ValueError,
        match=r'query and key must be on the same device, got '
        r'cpu and meta',
    ):
        local_correlation(x, x.to('meta'), 2, 3)


def test_integer_tensor():
    x, w = x_w()
    with pytest.raises(
        TypeError,
        match=r'input must be a floating point tensor \(float64, '
        r'float32, bfloat16 or float16\), got torch.int64',
    ):
        evolution_aggregate(x.long(), w)


def test_float8_is_a_type_error():
    x, w = x_w()
    f8 = torch.float8_e4m3fn
    with pytest.raises(
        TypeError,
        match=r'kernel must be a floating point '
        r'tensor .*, got torch.float8_e4m3fn',
    ):
        evolution_aggregate(x, w.to(f8))
    with pytest.raises(TypeError, match=r'query must be .*float8_e5m2'):
        local_correlation(x.to(torch.float8_e5m2), x, 2, 3)


@pytest.mark.parametrize('name', ['stride', 'padding', 'dilation'])
@pytest.mark.parametrize('value', [2**63, 2**64])
def test_beyond_int64_is_one_line(name, value):
    x, w = x_w(H=1, W=1)
    with pytest.raises(ValueError) as error:
        evolution_aggregate(x, w, **{name: value})
    assert str(error.value) == (
        f'{name} must be < 2**63 (an int64), got {value}'
    )


@pytest.mark.parametrize('op', ['aggregate', 'correlation'])
def test_window_span_overflow(op):
    """(K - 1) * d past int64 (it used to wrap: zeros, or a segfault)."""
    x = torch.ones(1, 1, 2, 2)
    with pytest.raises(
        ValueError,
        match=r'dilation=4611686018427387904 with kernel_size=3: the '
        r'window span \(kernel_size - 1\) \* dilation does not fit in '
        r'int64',
    ):
        if op == 'aggregate':
            evolution_aggregate(
                x, torch.ones(1, 1, 3, 3, 2, 2), padding=0, dilation=2**62
            )
        else:
            local_correlation(x, x, 1, 3, padding=0, dilation=2**62)


def test_padded_size_overflow():
    x = torch.ones(1, 1, 2, 2)
    with pytest.raises(
        ValueError,
        match=r'padding=4611686018427387904 with input height 2: input '
        r'height \+ 2 \* padding does not fit in int64',
    ):
        evolution_aggregate(
            x, torch.ones(1, 1, 1, 1, 2, 2), stride=2**62, padding=2**62
        )


def test_not_a_tensor():
    _, w = x_w()
    with pytest.raises(TypeError, match=r'input must be a Tensor, got list'):
        evolution_aggregate([[1.0]], w)


@pytest.mark.parametrize('name', ['stride', 'dilation'])
def test_stride_dilation_below_one(name):
    x, w = x_w()
    with pytest.raises(ValueError, match=rf'{name} must be >= 1, got 0'):
        evolution_aggregate(x, w, **{name: 0})


def test_non_integer_stride():
    x, w = x_w()
    with pytest.raises(TypeError, match=r'stride must be an int, got float'):
        evolution_aggregate(x, w, stride=1.0)


def test_negative_padding():
    x, w = x_w()
    with pytest.raises(ValueError, match=r'padding must be >= 0, got -1'):
        evolution_aggregate(x, w, padding=-1)


def test_even_kernel_with_same_padding():
    x, _ = x_w()
    with pytest.raises(ValueError, match=r'needs an odd kernel_size, got 4'):
        evolution_aggregate(x, torch.randn(2, 2, 4, 4, 9, 11))
    with pytest.raises(ValueError, match=r'needs an odd kernel_size, got 2'):
        local_correlation(x, x, 2, 2)


def test_unknown_padding_mode():
    x, w = x_w()
    with pytest.raises(
        ValueError,
        match=r"padding_mode must be one of \('zeros', 'reflect'\), "
        r"got 'circular'",
    ):
        evolution_aggregate(x, w, padding_mode='circular')


def test_map_too_small():
    x = torch.randn(1, 4, 2, 9)
    with pytest.raises(
        ValueError, match=r'input height of 2 is too small for kernel_size=5'
    ):
        evolution_aggregate(x, torch.randn(1, 1, 5, 5, 1, 5), padding=0)


# The fused attention weights share the correlation's checks.
CORRELATIONS = [local_correlation, local_attention_weights]


@pytest.mark.parametrize('op', CORRELATIONS)
def test_correlation_groups_not_dividing(op):
    x, _ = x_w(C=8)
    with pytest.raises(
        ValueError, match=r'key channels \(8\) must be divisible by groups=3'
    ):
        op(x, x, 3, 3)


@pytest.mark.parametrize('op', CORRELATIONS)
def test_correlation_query_shape(op):
    x, _ = x_w()
    with pytest.raises(
        ValueError,
        match=r'query must be \(B, C, H_out, W_out\) = \(2, 8, 5, 6\) '
        r'for key \(2, 8, 9, 11\), got \(2, 8, 9, 11\)',
    ):
        op(x, x, 2, 3, stride=2)


@pytest.mark.parametrize('op', CORRELATIONS)
def test_correlation_groups_not_int(op):
    x, _ = x_w()
    with pytest.raises(TypeError, match=r'groups must be an int, got str'):
        op(x, x, '2', 3)


def test_attention_weights_key_not_4d():
    x, _ = x_w()
    with pytest.raises(
        ValueError, match=r'key must be \(B, C, H, W\), got \(8, 9, 11\)'
    ):
        local_attention_weights(x, x[0], 2, 3)


# The raw operators take resolved arguments and check every relation
# themselves, on every backend: the entry of exported graphs and of C++.
X = (1, 4, 4, 4)
K3 = (1, 1, 3, 3, 4, 4)
# (op, shapes of the tensors, the other arguments, error, message)
RAW_CASES = [
    # a kernel map of the wrong size used to come back zero-padded (cpp) or
    # wrongly shaped (torch)
    (
        'evolution_aggregate',
        (X, (1, 1, 3, 3, 50, 50)),
        (1, 1, 1, 'zeros'),
        'ValueError',
        r'kernel must be \(B, G, K, K, H_out, W_out\) = \(1, 1, 3, 3, 4, 4\) '
        r'for input \(1, 4, 4, 4\), got \(1, 1, 3, 3, 50, 50\)',
    ),
    (
        'evolution_aggregate',
        (X, (1, 1, 3, 3, 4, 3)),
        (1, 1, 1, 'reflect'),
        'ValueError',
        r'= \(1, 1, 3, 3, 4, 4\) .* got \(1, 1, 3, 3, 4, 3\)',
    ),
    (
        'evolution_aggregate',
        (X, K3),
        (2, 1, 1, 'zeros'),
        'ValueError',
        r'= \(1, 1, 3, 3, 2, 2\) .* got \(1, 1, 3, 3, 4, 4\)',
    ),  # stride 2
    # the kernel map's batch (Triton read out of bounds with B 4 and 1)
    (
        'evolution_aggregate',
        ((4, 4, 4, 4), K3),
        (1, 1, 1, 'zeros'),
        'ValueError',
        r'= \(4, 1, 3, 3, 4, 4\) for input \(4, 4, 4, 4\), got '
        r'\(1, 1, 3, 3, 4, 4\)',
    ),
    (
        'evolution_aggregate',
        (X, (1, 1, 3, 5, 4, 4)),
        (1, 1, 1, 'zeros'),
        'ValueError',
        r'same K in both window dims, got \(1, 1, 3, 5, 4, 4\)',
    ),
    (
        'evolution_aggregate',
        (X, (1, 3, 3, 3, 4, 4)),
        (1, 1, 1, 'zeros'),
        'ValueError',
        r'input channels \(4\) must be divisible by the kernel '
        r'groups G=3',
    ),
    (
        'evolution_aggregate',
        ((1, 4, 2, 2), (1, 1, 5, 5, 1, 1)),
        (1, 0, 1, 'zeros'),
        'ValueError',
        r'input height of 2 is too small for kernel_size=5, dilation=1, '
        r'padding=0: output would be empty',
    ),
    (
        'evolution_aggregate',
        (X, K3),
        (1, 1, 1, 'garbage'),
        'ValueError',
        r"padding_mode must be one of \('zeros', 'reflect'\), got 'garbage'",
    ),
    (
        'evolution_aggregate',
        (X, K3),
        (0, 1, 1, 'zeros'),
        'ValueError',
        r'stride must be >= 1, got 0',
    ),
    (
        'evolution_aggregate',
        (X, K3),
        (1, -1, 1, 'zeros'),
        'ValueError',
        r'padding must be >= 0, got -1',
    ),
    (
        'evolution_aggregate',
        (X, K3),
        (1, 1, 2**62, 'zeros'),
        'ValueError',
        r'dilation=4611686018427387904 with kernel_size=3',
    ),
    (
        'evolution_aggregate',
        (X, K3),
        (2**62, 2**62, 1, 'zeros'),
        'ValueError',
        r'padding=4611686018427387904 with input height 4',
    ),
    (
        'evolution_aggregate',
        ((1, 4), K3),
        (1, 1, 1, 'zeros'),
        'ValueError',
        r'input must be \(B, C, H, W\), got \(1, 4\)',
    ),
    (
        'local_correlation',
        ((1, 4, 3, 3), X),
        (1, 3, 1, 1, 1, 'zeros'),
        'ValueError',
        r'query must be \(B, C, H_out, W_out\) = \(1, 4, 4, 4\) for key '
        r'\(1, 4, 4, 4\), got \(1, 4, 3, 3\)',
    ),
    (
        'local_correlation',
        ((2, 4, 4, 4), X),
        (1, 3, 1, 1, 1, 'zeros'),
        'ValueError',
        r'query must be .* got \(2, 4, 4, 4\)',
    ),
    (
        'local_correlation',
        (X, X),
        (1, 3, 1, 1, 1, 'garbage'),
        'ValueError',
        r'padding_mode must be one of',
    ),
    (
        'local_correlation',
        (X, X),
        (0, 3, 1, 1, 1, 'zeros'),
        'ValueError',
        r'groups must be >= 1, got 0',
    ),
    (
        'local_attention_weights',
        ((1, 8, 4, 4), X),
        (1, 3, 1, 1, 1, 'zeros'),
        'ValueError',
        r'query must be .* got \(1, 8, 4, 4\)',
    ),
    (
        'local_attention_weights',
        (X, X),
        (3, 3, 1, 1, 1, 'zeros'),
        'ValueError',
        r'key channels \(4\) must be divisible by groups=3',
    ),
    (
        'evolution_aggregate_transpose',
        (X, (1, 1, 3, 3, 9, 9)),
        (9, 9, 1, 1, 1, 'zeros'),
        'ValueError',
        r'grad must be \(B, C, H_out, W_out\) = \(1, 4, 9, 9\) for height=9, '
        r'width=9, got \(1, 4, 4, 4\)',
    ),
    (
        'evolution_aggregate_transpose',
        (X, (1, 1, 3, 3, 9, 9)),
        (4, 4, 1, 1, 1, 'zeros'),
        'ValueError',
        r'kernel must be .* = \(1, 1, 3, 3, 4, 4\) for grad \(1, 4, 4, 4\), '
        r'got \(1, 1, 3, 3, 9, 9\)',
    ),
    (
        'evolution_aggregate_transpose',
        (X, K3),
        (0, 4, 1, 1, 1, 'zeros'),
        'ValueError',
        r'height must be >= 1, got 0',
    ),
    (
        'evolution_aggregate_transpose',
        (X, K3),
        (4, 4, 1, 1, 1, 'reflekt'),
        'ValueError',
        r"padding_mode must be one of .* got 'reflekt'",
    ),
    # the fused involution's span rows against z, and its "same" padding
    # overflowing with the input, named by what it comes from
    (
        'fused_involution',
        ((2, 8, 9, 9), (2, 5, 9, 9), (18, 4, 1, 1)),
        (None, 3, 1, 1, 2),
        'ValueError',
        r'^span_weight must be \(G\*K\*K, C_r, 1, 1\) = \(18, 5, 1, 1\) for '
        r'groups=2, kernel_size=3 and z with C_r=5 channels, got',
    ),
    (
        'fused_involution',
        ((2, 8, 9, 9), (2, 4, 9, 9), (18, 4, 1, 1)),
        (None, 3, 1, 2**62 - 1, 2),
        'ValueError',
        r'^dilation=4611686018427387903 with kernel_size=3 pads the input by '
        r'4611686018427387903 \("same"\), and input 9 x 9 plus twice that '
        r'does not fit in int64$',
    ),
]


ERRORS = {'ValueError': ValueError, 'TypeError': TypeError}


def run_raw(op, shapes, args, dtypes=None, devices=None):
    dtypes = dtypes or [torch.float32] * len(shapes)
    devices = devices or ['cpu'] * len(shapes)
    tensors = [
        torch.randn(shape).to(dtype).to(device)
        for shape, dtype, device in zip(shapes, dtypes, devices, strict=True)
    ]
    return getattr(torch.ops.mmevo, op)(*tensors, *args)


BACKENDS = (
    ['cpp', 'torch', 'triton']
    if cpp_backend.available()
    else ['torch', 'triton']
)


# 'triton' with CPU tensors: the checks run before any kernel (the kernels
# themselves run under TRITON_INTERPRET=1, in test_triton_interpret.py).
@pytest.mark.parametrize('backend', BACKENDS)
@pytest.mark.parametrize('op,shapes,args,error,message', RAW_CASES)
def test_raw_op_checks(backend, op, shapes, args, error, message):
    with library.use_backend(backend):
        with pytest.raises(ERRORS[error], match=message):
            run_raw(op, shapes, args)


@pytest.mark.parametrize('op,shapes,args,error,message', RAW_CASES)
def test_fake_kernel_checks(op, shapes, args, error, message):
    """The fake kernels (torch.compile, torch.export) check as the real
    ones: meta tensors."""
    with pytest.raises(ValueError, match=message):
        run_raw(op, shapes, args, devices=['meta'] * len(shapes))


@pytest.mark.parametrize('backend', BACKENDS)
def test_raw_op_checks_devices_and_dtypes(backend):
    """A CPU input with a meta kernel map used to return an uninitialised
    tensor; float8 a NotImplementedError."""
    with library.use_backend(backend):
        with pytest.raises(
            ValueError,
            match=r'input and kernel must be on the same '
            r'device, got cpu and meta',
        ):
            run_raw(
                'evolution_aggregate',
                (X, K3),
                (1, 1, 1, 'zeros'),
                devices=('cpu', 'meta'),
            )
        with pytest.raises(
            TypeError,
            match=r'query and key must have the same dtype, '
            r'got torch.float64 and torch.float32',
        ):
            run_raw(
                'local_correlation',
                (X, X),
                (1, 3, 1, 1, 1, 'zeros'),
                dtypes=(torch.float64, torch.float32),
            )
        with pytest.raises(
            TypeError,
            match=r'grad must be a floating point '
            r'tensor .* got torch.float8_e4m3fn',
        ):
            run_raw(
                'evolution_aggregate_transpose',
                (X, K3),
                (4, 4, 1, 1, 1, 'zeros'),
                dtypes=(torch.float8_e4m3fn, torch.float8_e4m3fn),
            )


CPP_ONLY = r"""
import json, sys
import torch
torch.ops.load_library(sys.argv[1])
cases = json.loads(sys.argv[2])
out = []
for op, shapes, args in cases:
    tensors = [torch.randn(shape) for shape in shapes]
    try:
        getattr(torch.ops.mmevo, op)(*tensors, *args)
        out.append(['no error', ''])
    except Exception as e:
        out.append([type(e).__name__, str(e).splitlines()[0]])
out.append(sorted(m for m in sys.modules if m.startswith('mmevo')))
print(json.dumps(out))
"""


@pytest.mark.skipif(
    not cpp_backend.available(), reason='the C++ extension is not built'
)
@pytest.mark.slow
def test_cpp_operators_check_without_python_side():
    """The C++ operators alone, in a process that never imported mmevo:
    the same errors and messages."""
    cases = [[op, shapes, args] for op, shapes, args, _, _ in RAW_CASES]
    run = subprocess.run(
        [
            sys.executable,
            '-c',
            CPP_ONLY,
            cpp_backend.LIBRARY,
            json.dumps(cases),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=os.path.dirname(cpp_backend.LIBRARY),
        env=dict(os.environ, PYTHONPATH=''),
    )
    assert run.returncode == 0, run.stderr[-3000:]
    *results, modules = json.loads(run.stdout.strip().splitlines()[-1])
    assert modules == []
    for (op, _, _, error, message), (got_error, got) in zip(
        RAW_CASES, results, strict=True
    ):
        assert got_error == error, (op, got_error, got)
        assert re.search(message, got), (op, message, got)
