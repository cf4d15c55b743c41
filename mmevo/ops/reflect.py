"""Reflect padding made explicit for the zero-padding kernels of the Triton
and PyTorch backends, and its transpose (see :mod:`mmevo.ops.dispatch`)."""

import torch

from . import torch_backend


def concrete_reflect_index(
    size: int, padding: int, device: torch.device
) -> torch.Tensor:
    """Source index of each of the ``size + 2 * padding`` padded positions
    of a map of a known ``size`` (the decompositions' is symbolic).

    numpy-style 'reflect' (the edge is not repeated), folded again as often as
    needed, so any padding works on any size, 1 included.
    """
    return torch_backend.reflect_positions(
        torch.arange(-padding, size + padding, device=device), size
    )


def small_padding(padding, H, W):
    """Whether one reflection suffices, i.e. aten's reflection_pad is exact."""
    return padding < H and padding < W


def padded_fits(padding, H, W):
    """Whether the padded map may be materialised: a few times the map at
    most (or 64K pixels); as ``csrc/ops.cpp``'s ``padded_fits``."""
    return (H + 2 * padding) * (W + 2 * padding) <= max(1 << 16, 4 * H * W)


def explicit_padding(x, padding):
    """x reflect-padded for the zero-padding kernels."""
    H, W = x.shape[-2:]
    if small_padding(padding, H, W):
        # aten's reflection pad is numpy 'reflect' here and several times
        # faster than two index_select gathers.
        return torch.nn.functional.pad(x, (padding,) * 4, mode='reflect')
    # Padding >= size reflects repeatedly, which aten rejects: gather.
    rows = concrete_reflect_index(H, padding, x.device)
    cols = concrete_reflect_index(W, padding, x.device)
    return x.index_select(2, rows).index_select(3, cols)


def fold_reflect(gxp, padding, H, W):
    """Transpose of the reflect padding: add padded positions to their source.

    Summed in fp32 at least when the padding reflects repeatedly: a pixel of
    a small map then receives up to ``(1 + 2 * padding)**2`` terms.
    """
    # aten's reflection pad backward and index_add_ are sequential, so
    # deterministic, on CPU only; elsewhere they add with atomics.
    if gxp.device.type == 'cpu' and small_padding(padding, H, W):
        # Only the shape of the second argument is read, so it stays empty.
        return torch.ops.aten.reflection_pad2d_backward(
            gxp, gxp.new_empty(*gxp.shape[:2], H, W), [padding] * 4
        )
    dtype = gxp.dtype
    gxp = gxp.to(torch.promote_types(dtype, torch.float32))
    rows = concrete_reflect_index(H, padding, gxp.device)
    cols = concrete_reflect_index(W, padding, gxp.device)
    if gxp.device.type == 'cpu':
        out = gxp.new_zeros(*gxp.shape[:2], H, gxp.shape[3]).index_add_(
            2, rows, gxp
        )
        return (
            gxp.new_zeros(*gxp.shape[:2], H, W)
            .index_add_(3, cols, out)
            .to(dtype)
        )
    # A one-hot matmul is deterministic.
    rh = torch.nn.functional.one_hot(rows, H).to(gxp.dtype)  # (Hp, H)
    rw = torch.nn.functional.one_hot(cols, W).to(gxp.dtype)  # (Wp, W)
    return torch.matmul(torch.matmul(rh.t(), gxp), rw).to(dtype)
