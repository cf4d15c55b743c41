"""Every documented bad input raises ValueError/TypeError naming the
argument."""
import importlib.util

import pytest
import torch

from mmevo.ops import (evolution_aggregate, library, local_attention_weights,
                       local_correlation)


def x_w(C=8, H=9, W=11, G=2, K=3, Ho=None, Wo=None, dtype=torch.float32):
    return (torch.randn(2, C, H, W, dtype=dtype),
            torch.randn(2, G, K, K, Ho or H, Wo or W, dtype=dtype))


def test_input_not_4d():
    _, w = x_w()
    with pytest.raises(
            ValueError,
            match=r'input must be \(B, C, H, W\), got \(8, 9, 11\)'):
        evolution_aggregate(torch.randn(8, 9, 11), w)


def test_kernel_wrong_rank():
    x, _ = x_w()
    with pytest.raises(
            ValueError,
            match=r'kernel must be \(B, G, K, K, H_out, W_out\), '
            r'got \(2, 2, 9, 9, 11\)'):
        evolution_aggregate(x, torch.randn(2, 2, 9, 9, 11))


def test_kernel_window_dims_differ():
    x, _ = x_w()
    with pytest.raises(
            ValueError,
            match=r'same K in both window dims, got \(2, 2, 3, 5, 9, 11\)'):
        evolution_aggregate(x, torch.randn(2, 2, 3, 5, 9, 11))


def test_channels_not_divisible_by_groups():
    x, w = x_w(C=8, G=3)
    with pytest.raises(
            ValueError,
            match=r'input channels \(8\) must be divisible by the '
            r'kernel groups G=3'):
        evolution_aggregate(x, w)


def test_kernel_output_height_mismatch():
    x, w = x_w(Ho=8)
    with pytest.raises(
            ValueError,
            match=r'kernel must be .* = \(2, 2, 3, 3, 9, 11\) for input '
            r'\(2, 8, 9, 11\), got \(2, 2, 3, 3, 8, 11\)'):
        evolution_aggregate(x, w)


def test_kernel_output_width_mismatch():
    x, w = x_w(Wo=6)
    # stride 2 on 9 x 11 gives 5 x 6: the expectation accounts for the
    # stride.
    with pytest.raises(
            ValueError,
            match=r'= \(2, 2, 3, 3, 9, 11\) .* got \(2, 2, 3, 3, 9, 6\)'):
        evolution_aggregate(x, w)
    evolution_aggregate(x, torch.randn(2, 2, 3, 3, 5, 6), stride=2)


def test_dtype_mismatch():
    x, w = x_w()
    with pytest.raises(
            TypeError,
            match=r'input and kernel must have the same dtype, got '
            r'torch.float32 and torch.float64'):
        evolution_aggregate(x, w.double())


def test_device_mismatch():
    x, w = x_w()
    with pytest.raises(
            ValueError,
            match=r'query and key must be on the same device, got '
            r'cpu and meta'):
        local_correlation(x, x.to('meta'), 2, 3)


def test_integer_tensor():
    x, w = x_w()
    with pytest.raises(
            TypeError,
            match=r'input must be a floating point tensor, got torch.int64'):
        evolution_aggregate(x.long(), w)


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
            r"got 'circular'"):
        evolution_aggregate(x, w, padding_mode='circular')


def test_map_too_small():
    x = torch.randn(1, 4, 2, 9)
    with pytest.raises(
            ValueError,
            match=r'input height of 2 is too small for kernel_size=5'):
        evolution_aggregate(x, torch.randn(1, 1, 5, 5, 1, 5), padding=0)


# The fused attention weights share the correlation's checks.
CORRELATIONS = [local_correlation, local_attention_weights]


@pytest.mark.parametrize('op', CORRELATIONS)
def test_correlation_groups_not_dividing(op):
    x, _ = x_w(C=8)
    with pytest.raises(
            ValueError,
            match=r'key channels \(8\) must be divisible by groups=3'):
        op(x, x, 3, 3)


@pytest.mark.parametrize('op', CORRELATIONS)
def test_correlation_query_shape(op):
    x, _ = x_w()
    with pytest.raises(
            ValueError,
            match=r'query must be \(B, C, H_out, W_out\) = \(2, 8, 5, 6\) '
            r'for key \(2, 8, 9, 11\), got \(2, 8, 9, 11\)'):
        op(x, x, 2, 3, stride=2)


@pytest.mark.parametrize('op', CORRELATIONS)
def test_correlation_groups_not_int(op):
    x, _ = x_w()
    with pytest.raises(TypeError, match=r'groups must be an int, got str'):
        op(x, x, '2', 3)


def test_attention_weights_key_not_4d():
    x, _ = x_w()
    with pytest.raises(
            ValueError, match=r'key must be \(B, C, H, W\), got \(8, 9, 11\)'):
        local_attention_weights(x, x[0], 2, 3)


# The registered ops take resolved arguments and skip the checks above; the
# C++ kernels check every shape relation they rely on themselves.
requires_ext = pytest.mark.skipif(
    importlib.util.find_spec('mmevo._ext') is None,
    reason='the C++ extension is not built')
X = (1, 4, 4, 4)
# (op, shapes of the two tensors, the other arguments, message)
RAW_CASES = [
    # a kernel map of the wrong size used to come back zero-padded
    ('evolution_aggregate', (X, (1, 1, 3, 3, 50, 50)), (1, 1, 1, 'zeros'),
     r'kernel must be \(B, G, K, K, H_out, W_out\) = \[1, 1, 3, 3, 4, 4\] '
     r'for an input of \[1, 4, 4, 4\], stride=1, padding=1, dilation=1, '
     r'got \[1, 1, 3, 3, 50, 50\]'),
    ('evolution_aggregate', (X, (1, 1, 3, 3, 4, 4)), (2, 1, 1, 'zeros'),
     r'= \[1, 1, 3, 3, 2, 2\] .* got \[1, 1, 3, 3, 4, 4\]'),  # stride 2
    # reflect padding is made explicit before the kernel
    ('evolution_aggregate', (X, (1, 1, 3, 3, 5, 5)), (1, 1, 1, 'reflect'),
     r'= \[1, 1, 3, 3, 4, 4\] .* got \[1, 1, 3, 3, 5, 5\]'),
    ('evolution_aggregate', (X, (2, 1, 3, 3, 4, 4)), (1, 1, 1, 'zeros'),
     r'= \[1, 1, 3, 3, 4, 4\] .* got \[2, 1, 3, 3, 4, 4\]'),
    ('evolution_aggregate', (X, (1, 1, 3, 5, 4, 4)), (1, 1, 1, 'zeros'),
     r'= \[1, 1, 3, 3, 4, 4\] .* got \[1, 1, 3, 5, 4, 4\]'),
    ('evolution_aggregate', (X, (1, 3, 3, 3, 4, 4)), (1, 1, 1, 'zeros'),
     r'channels \(4\) must be divisible by groups \(3\)'),
    ('evolution_aggregate', ((1, 4, 2, 2), (1, 1, 5, 5, 1, 1)), (1, 0, 1,
                                                                 'zeros'),
     r'input map 2x2 is too small for kernel_size=5, padding=0'),
    ('local_correlation', ((1, 4, 3, 3), X), (1, 3, 1, 1, 1, 'zeros'),
     r'query must be \(B, C, H_out, W_out\) = \[1, 4, 4, 4\] for an input '
     r'of \[1, 4, 4, 4\], stride=1, padding=1, dilation=1, got '
     r'\[1, 4, 3, 3\]'),
    ('local_correlation', ((2, 4, 4, 4), X), (1, 3, 1, 1, 1, 'zeros'),
     r'query must be .* got \[2, 4, 4, 4\]'),
    ('local_attention_weights', ((1, 8, 4, 4), X), (1, 3, 1, 1, 1, 'zeros'),
     r'query must be .* got \[1, 8, 4, 4\]'),
    ('local_attention_weights', (X, X), (3, 3, 1, 1, 1, 'zeros'),
     r'channels \(4\) must be divisible by groups \(3\)'),
    ('evolution_aggregate_transpose', (X, (1, 1, 3, 3, 4, 4)), (9, 9, 1, 1, 1,
                                                                'zeros'),
     r'grad_y must be \(B, C, H_out, W_out\) = \[1, 4, 9, 9\] for an input '
     r'of \[1, 4, 9, 9\], .* got \[1, 4, 4, 4\]'),
    ('evolution_aggregate_transpose', (X, (1, 1, 3, 3, 9, 9)), (4, 4, 1, 1, 1,
                                                                'zeros'),
     r'kernel must be .* = \[1, 1, 3, 3, 4, 4\] .* got \[1, 1, 3, 3, 9, 9\]'),
]


@requires_ext
@pytest.mark.parametrize('op,shapes,args,message', RAW_CASES)
def test_registered_op_checks_shapes(op, shapes, args, message):
    tensors = [torch.randn(shape) for shape in shapes]
    with library.use_backend('cpp'):
        with pytest.raises(RuntimeError, match=message):
            getattr(torch.ops.mmevo, op)(*tensors, *args)


@requires_ext
@pytest.mark.parametrize(
    'call', ['aggregate_forward', 'aggregate_transpose', 'correlate'])
def test_kernels_refuse_zero_channels(call):
    """C = 0 reaches no kernel (the ops answer it first); called directly,
    the C++ entry points refuse it instead of dividing by zero (SIGFPE)."""
    from mmevo import _ext
    x, w = torch.randn(2, 0, 9, 11), torch.randn(2, 1, 3, 3, 9, 11)
    args = dict(
        aggregate_forward=(x, w, 1, 1, 1),
        aggregate_transpose=(x, w, 9, 11, 1, 1, 1),
        correlate=(x, x, 1, 3, 1, 1, 1, False))[call]
    with pytest.raises(
            RuntimeError, match=r'input of \[2, 0, 9, 11\] has '
            r'no channels'):
        getattr(_ext, call)(*args)
