"""Public entry points of the evolution ops: validation and dispatch.

Every argument is checked here, once, so that no kernel ever sees a shape it
cannot handle; then the ``torch.ops.mmevo`` operator runs (defined in
``library.py``, dispatched in ``dispatch.py``, differentiated in
``autograd.py``; backends ``cpp_backend.py`` (the C++ kernels of
``csrc/``), ``triton_backend.py`` and ``torch_backend.py``).
``reference.py`` is the formula in plain PyTorch. While
``torch.onnx.export`` runs, the ops are standard ONNX operators instead
(``decompositions.py``, sizes kept symbolic: the checks that read the map
sizes are skipped).
"""

import torch

# autograd and dispatch: the kernels and gradients of torch.ops.mmevo.*
from . import autograd, decompositions, dispatch  # noqa: F401
from .checks import (  # noqa: F401
    PADDING_MODES,
    Window,
    check_aggregate,
    check_correlation,
    check_int,
    check_pair,
    check_tensor,
    kernel_size_of,
    output_size,
    resolve_window,
)


def _autocast(a, b):
    """Under autocast, run in its dtype (like a convolution), so that a fp32
    feature map and a low-precision kernel from a conv can be mixed."""
    device = a.device.type
    if (
        device in ('cpu', 'cuda')
        and torch.is_autocast_enabled(device)
        and a.is_floating_point()
        and b.is_floating_point()
    ):
        dtype = torch.get_autocast_dtype(device)
        return a.to(dtype), b.to(dtype)
    return a, b


def evolution_aggregate(
    input: torch.Tensor,
    kernel: torch.Tensor,
    stride: int = 1,
    padding: int | None = None,
    dilation: int = 1,
    padding_mode: str = 'zeros',
) -> torch.Tensor:
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
        the autocast dtype, to which both inputs are cast); channels-last
        when ``input`` is (and is not also contiguous), as a convolution's
        output follows its input. With zero padding the CPU kernel reads
        a channels-last input and any kernel layout in place.

    Example:
        >>> x = torch.randn(2, 32, 9, 11)
        >>> w = torch.randn(2, 4, 3, 3, 9, 11)
        >>> evolution_aggregate(x, w).shape
        torch.Size([2, 32, 9, 11])
    """
    check_tensor('input', input, 4, '(B, C, H, W)')
    check_tensor('kernel', kernel, 6, '(B, G, K, K, H_out, W_out)')
    input, kernel = _autocast(input, kernel)
    check_pair('input', input, 'kernel', kernel)
    window = Window.resolve(
        kernel_size_of(kernel), stride, padding, dilation, padding_mode
    )
    if torch.onnx.is_in_onnx_export():
        check_aggregate(input, kernel, *window.scalars(), maps=False)
        return decompositions.aggregate(input, kernel, window)
    # The operator checks the shapes (on every backend, and in C++).
    return torch.ops.mmevo.evolution_aggregate(
        input, kernel, *window.scalars()
    )


def local_correlation(
    query: torch.Tensor,
    key: torch.Tensor,
    groups: int,
    kernel_size: int,
    stride: int = 1,
    padding: int | None = None,
    dilation: int = 1,
    padding_mode: str = 'zeros',
) -> torch.Tensor:
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
    return _correlation(
        query,
        key,
        groups,
        (kernel_size, stride, padding, dilation, padding_mode),
        softmax=False,
    )


def local_attention_weights(
    query: torch.Tensor,
    key: torch.Tensor,
    groups: int,
    kernel_size: int,
    stride: int = 1,
    padding: int | None = None,
    dilation: int = 1,
    padding_mode: str = 'zeros',
) -> torch.Tensor:
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
    return _correlation(
        query,
        key,
        groups,
        (kernel_size, stride, padding, dilation, padding_mode),
        softmax=True,
    )


def _correlation(query, key, groups, window, softmax):
    """A correlation op (``softmax``: the attention weights) on the checked
    arguments, ``window`` the public ones; under ONNX export, its
    decomposition."""
    check_tensor('query', query, 4, '(B, C, H_out, W_out)')
    check_tensor('key', key, 4, '(B, C, H, W)')
    query, key = _autocast(query, key)
    check_pair('query', query, 'key', key)
    check_int('groups', groups, 1)
    window = Window.resolve(*window)
    args = (query, key, groups, window.kernel_size, *window.scalars())
    if torch.onnx.is_in_onnx_export():
        check_correlation(*args, maps=False)
        return decompositions.correlation(query, key, groups, window, softmax)
    # The operator checks the shapes (on every backend, and in C++).
    op = (
        torch.ops.mmevo.local_attention_weights
        if softmax
        else torch.ops.mmevo.local_correlation
    )
    return op(*args)
