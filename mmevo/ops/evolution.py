"""Public entry points of the evolution ops: validation and dispatch.

Every argument is checked here, once, so that no kernel ever sees a shape it
cannot handle; then the ``torch.ops.mmevo`` operator runs (registered in
``library.py``; backends ``cpp_backend.py`` (the C++ kernels of ``csrc/``),
``triton_backend.py`` and ``torch_backend.py``). ``reference.py`` is the
formula in plain PyTorch. While ``torch.onnx.export`` runs, the ops are
standard ONNX operators instead (``export.py``, sizes kept symbolic).
"""
import torch

from . import export, library  # noqa: F401  (library: torch.ops.mmevo.*)

PADDING_MODES = ('zeros', 'reflect')


def check_int(name, value, minimum=1):
    """Raise a clear error unless ``value`` is an int >= ``minimum``.

    Args:
        name (str): the argument's name, for the message.
        value: the value to check (a bool is not an int here).
        minimum (int): the smallest value allowed. Default: 1.

    Example:
        >>> check_int('stride', 2)
        >>> check_int('padding', -1, minimum=0)
        Traceback (most recent call last):
        ...
        ValueError: padding must be >= 0, got -1
    """
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f'{name} must be an int, got {type(value).__name__} '
                        f'{value!r}')
    if value < minimum:
        raise ValueError(f'{name} must be >= {minimum}, got {value}')


def resolve_window(kernel_size, stride, padding, dilation, padding_mode):
    """Check the window arguments; return the padding ('same' resolved).

    Args:
        kernel_size (int): K, >= 1.
        stride (int): >= 1.
        padding (int | None): >= 0, or None for "same",
            ``dilation * (K - 1) // 2`` (K must be odd).
        dilation (int): >= 1.
        padding_mode (str): one of :data:`PADDING_MODES`.

    Returns:
        int: the padding on every side.

    Example:
        >>> resolve_window(7, 1, None, 2, 'zeros')
        6
    """
    check_int('kernel_size', kernel_size, 1)
    check_int('stride', stride, 1)
    check_int('dilation', dilation, 1)
    if padding_mode not in PADDING_MODES:
        raise ValueError(f'padding_mode must be one of {PADDING_MODES}, '
                         f'got {padding_mode!r}')
    if padding is None:
        if kernel_size % 2 == 0:
            raise ValueError(
                f'padding=None ("same") needs an odd kernel_size, '
                f'got {kernel_size}; pass padding explicitly')
        return dilation * (kernel_size - 1) // 2
    check_int('padding', padding, 0)
    return padding


def output_size(size, kernel_size, stride, padding, dilation):
    """Convolution output size rule: floor((H + 2p - d(K-1) - 1) / s) + 1."""
    return (size + 2 * padding - dilation *
            (kernel_size - 1) - 1) // stride + 1


def _check_tensor(name, t, ndim, shape_doc):
    if not isinstance(t, torch.Tensor):
        raise TypeError(f'{name} must be a Tensor, got {type(t).__name__}')
    if t.dim() != ndim:
        raise ValueError(f'{name} must be {shape_doc}, got {tuple(t.shape)}')
    if not t.is_floating_point():
        raise TypeError(
            f'{name} must be a floating point tensor, got {t.dtype}')


def _autocast(a, b):
    """Under autocast, run in its dtype (like a convolution), so that a fp32
    feature map and a low-precision kernel from a conv can be mixed."""
    device = a.device.type
    if (device in ('cpu', 'cuda') and torch.is_autocast_enabled(device)
            and a.is_floating_point() and b.is_floating_point()):
        dtype = torch.get_autocast_dtype(device)
        return a.to(dtype), b.to(dtype)
    return a, b


def _check_pair(name_a, a, name_b, b):
    if a.dtype != b.dtype:
        raise TypeError(f'{name_a} and {name_b} must have the same dtype, '
                        f'got {a.dtype} and {b.dtype}')
    if a.device != b.device:
        raise ValueError(f'{name_a} and {name_b} must be on the same device, '
                         f'got {a.device} and {b.device}')


def _sizes(t):
    """``t.shape`` as ints: under torch.jit.trace (FLOP counting) sizes
    come back as tensors. SymInts stay symbolic: an int() would freeze a
    dynamic size of torch.export (AOTInductor) to the example's."""
    return [int(n) if isinstance(n, torch.Tensor) else n for n in t.shape]


def _check_map(name, size, kernel_size, stride, padding, dilation):
    if size < 1:  # B = 0 and C = 0 are fine, an empty map has no windows
        raise ValueError(f'{name} must be >= 1, got {size}')
    out = output_size(size, kernel_size, stride, padding, dilation)
    if out < 1:
        raise ValueError(
            f'{name} of {size} is too small for kernel_size={kernel_size}, '
            f'dilation={dilation}, padding={padding}: output would be empty')
    return out


def evolution_aggregate(input,
                        kernel,
                        stride=1,
                        padding=None,
                        dilation=1,
                        padding_mode='zeros'):
    """Apply a per-pixel, per-group K x K kernel to the windows of ``input``.

    ``Y[b, c, i, j] = sum_{u, v} kernel[b, g(c), u, v, i, j] *
    input[b, c, i*s - p + u*d, j*s - p + v*d]`` with ``g(c) = c // (C // G)``.

    Args:
        input (Tensor): (B, C, H, W); B and C may be 0 (an empty result).
        kernel (Tensor): (B, G, K, K, H_out, W_out), C divisible by G.
        stride (int): window step. Default: 1.
        padding (int | None): padding on every side; None is "same",
            ``dilation * (K - 1) // 2`` (K must be odd). Default: None.
        dilation (int): spacing of the window taps. Default: 1.
        padding_mode (str): 'zeros' or 'reflect' (numpy-style, also for
            paddings not smaller than the map). Default: 'zeros'.

    Returns:
        Tensor: (B, C, H_out, W_out), the dtype of ``input`` (under autocast,
        the autocast dtype, to which both inputs are cast).

    Example:
        >>> x = torch.randn(2, 32, 9, 11)
        >>> w = torch.randn(2, 4, 3, 3, 9, 11)
        >>> evolution_aggregate(x, w).shape
        torch.Size([2, 32, 9, 11])
    """
    _check_tensor('input', input, 4, '(B, C, H, W)')
    _check_tensor('kernel', kernel, 6, '(B, G, K, K, H_out, W_out)')
    input, kernel = _autocast(input, kernel)
    _check_pair('input', input, 'kernel', kernel)
    if torch.onnx.is_in_onnx_export():
        return _export_aggregate(input, kernel, stride, padding, dilation,
                                 padding_mode)
    B, C, H, W = _sizes(input)
    K = int(kernel.shape[2])
    if int(kernel.shape[3]) != K:
        raise ValueError(
            f'kernel must be (B, G, K, K, H_out, W_out) with the '
            f'same K in both window dims, got {tuple(kernel.shape)}')
    padding = resolve_window(K, stride, padding, dilation, padding_mode)
    G = int(kernel.shape[1])
    if G < 1 or C % G:
        raise ValueError(f'input channels ({C}) must be divisible by the '
                         f'kernel groups G={G}; kernel {tuple(kernel.shape)}')
    H_out = _check_map('input height', H, K, stride, padding, dilation)
    W_out = _check_map('input width', W, K, stride, padding, dilation)
    expected = (B, G, K, K, H_out, W_out)
    if tuple(kernel.shape) != expected:
        raise ValueError(f'kernel must be (B, G, K, K, H_out, W_out) = '
                         f'{expected} for input {tuple(input.shape)}, '
                         f'got {tuple(kernel.shape)}')
    return torch.ops.mmevo.evolution_aggregate(input, kernel, stride, padding,
                                               dilation, padding_mode)


def local_correlation(query,
                      key,
                      groups,
                      kernel_size,
                      stride=1,
                      padding=None,
                      dilation=1,
                      padding_mode='zeros'):
    """Per-group dot products of each query with the key window around it.

    ``out[b, g, u, v, i, j] = sum_{c in g} query[b, c, i, j] *
    key[b, c, i*s - p + u*d, j*s - p + v*d]``: the transpose of
    :func:`evolution_aggregate`, so local attention is
    ``evolution_aggregate(v, softmax(local_correlation(q, k, ...)))``.

    Args:
        query (Tensor): (B, C, H_out, W_out), at the output positions; B
            and C may be 0 (with C = 0 the sums are 0).
        key (Tensor): (B, C, H, W).
        groups (int): G, C divisible by G (the attention heads).
        kernel_size (int): K, the window size.
        stride, padding, dilation, padding_mode: as in
            :func:`evolution_aggregate`.

    Returns:
        Tensor: (B, G, K, K, H_out, W_out), the dtype of ``query`` (under
        autocast, the autocast dtype).

    Example:
        >>> q, k = torch.randn(2, 32, 5, 6), torch.randn(2, 32, 9, 11)
        >>> local_correlation(q, k, groups=4, kernel_size=3, stride=2).shape
        torch.Size([2, 4, 3, 3, 5, 6])
    """
    if torch.onnx.is_in_onnx_export():
        return _export_correlation(query, key, groups, kernel_size, stride,
                                   padding, dilation, padding_mode, False)
    return torch.ops.mmevo.local_correlation(
        *_correlation_args(query, key, groups, kernel_size, stride, padding,
                           dilation, padding_mode))


def local_attention_weights(query,
                            key,
                            groups,
                            kernel_size,
                            stride=1,
                            padding=None,
                            dilation=1,
                            padding_mode='zeros'):
    """Softmax over each window of :func:`local_correlation`, fused.

    ``softmax(local_correlation(query, key, ...))`` over the K x K window of
    every (b, g, i, j): the weights of local self-attention. The C++ kernel
    normalises each tile's sums before writing them, so the logits never
    make a trip through memory; the other backends run the softmax after.

    Args:
        query, key, groups, kernel_size, stride, padding, dilation,
            padding_mode: as in :func:`local_correlation`.

    Returns:
        Tensor: (B, G, K, K, H_out, W_out), summing to 1 over (K, K).

    Example:
        >>> q, k = torch.randn(2, 32, 9, 11), torch.randn(2, 32, 9, 11)
        >>> w = local_attention_weights(q, k, groups=4, kernel_size=3)
        >>> torch.allclose(w.sum((2, 3)), torch.ones(2, 4, 9, 11))
        True
    """
    if torch.onnx.is_in_onnx_export():
        return _export_correlation(query, key, groups, kernel_size, stride,
                                   padding, dilation, padding_mode, True)
    return torch.ops.mmevo.local_attention_weights(
        *_correlation_args(query, key, groups, kernel_size, stride, padding,
                           dilation, padding_mode))


def _correlation_args(query, key, groups, kernel_size, stride, padding,
                      dilation, padding_mode):
    """Check the arguments of the correlation ops; return them resolved."""
    _check_tensor('query', query, 4, '(B, C, H_out, W_out)')
    _check_tensor('key', key, 4, '(B, C, H, W)')
    query, key = _autocast(query, key)
    _check_pair('query', query, 'key', key)
    check_int('groups', groups, 1)
    padding = resolve_window(kernel_size, stride, padding, dilation,
                             padding_mode)
    B, C, H, W = _sizes(key)
    if C % groups:
        raise ValueError(f'key channels ({C}) must be divisible by '
                         f'groups={groups}')
    H_out = _check_map('key height', H, kernel_size, stride, padding, dilation)
    W_out = _check_map('key width', W, kernel_size, stride, padding, dilation)
    expected = (B, C, H_out, W_out)
    if tuple(query.shape) != expected:
        raise ValueError(f'query must be (B, C, H_out, W_out) = {expected} '
                         f'for key {tuple(key.shape)}, got '
                         f'{tuple(query.shape)}')
    return (query, key, groups, kernel_size, stride, padding, dilation,
            padding_mode)


# ONNX export: only the checks that do not read H and W, which stay symbolic
# (an int() or a comparison would freeze them into the graph).
def _export_aggregate(input, kernel, stride, padding, dilation, padding_mode):
    K, G, C = kernel.shape[2], kernel.shape[1], input.shape[1]
    if isinstance(K, torch.Tensor):  # TorchScript tracing: constants here
        K, G, C = int(K), int(G), int(C)
    if kernel.shape[3] != K or C % G:
        raise ValueError(f'kernel must be (B, G, K, K, H_out, W_out) with '
                         f'C={C} divisible by G, got {tuple(kernel.shape)}')
    padding = resolve_window(K, stride, padding, dilation, padding_mode)
    return export.aggregate(input, kernel, stride, padding, dilation,
                            padding_mode)


def _export_correlation(query, key, groups, kernel_size, stride, padding,
                        dilation, padding_mode, softmax):
    _check_tensor('query', query, 4, '(B, C, H_out, W_out)')
    _check_tensor('key', key, 4, '(B, C, H, W)')
    _check_pair('query', query, 'key', key)
    check_int('groups', groups, 1)
    padding = resolve_window(kernel_size, stride, padding, dilation,
                             padding_mode)
    if int(key.shape[1]) % groups:
        raise ValueError(f'key channels ({int(key.shape[1])}) must be '
                         f'divisible by groups={groups}')
    return export.correlation(query, key, groups, kernel_size, stride, padding,
                              dilation, padding_mode, softmax)
