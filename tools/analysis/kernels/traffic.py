"""DRAM traffic of the Triton kernels, modelled from their tiling.

One function per kernel of :mod:`mmevo.ops.triton_kernels`, using its own
tiling helpers (:func:`~mmevo.ops.triton_kernels.block_w`,
:func:`~mmevo.ops.triton_kernels.strip_rows`), so the model changes with the
kernels.
Each gives, per operand, three byte counts of one launch:

* ``minimal``: the operand read (or written) once, whole;
* ``requested``: the distinct elements each program loads (or stores),
  summed over the programs: reuse inside a program is free, none across
  programs. ``tests/tools/analysis/kernels/test_traffic.py`` checks it
  against the addresses the kernels load under ``TRITON_INTERPRET=1``;
* ``l2``: an L2-aware estimate. Programs sharing data are neighbours in the
  grid order (column blocks, then strips, of one (batch, group)), so a halo
  re-read is a hit when the programs launched between the two reads
  requested at most half the L2 (the rest for the programs in flight); it
  then costs the elements touched at least once, else ``requested``.

These are estimates, for the GPU check's measurements to replace.

Example:
    >>> from mmevo.ops.checks import Window
    >>> t = aggregate(64, 64, 4, (56, 56), Window(7, 1, 3, 1), block_p=128,
    ...               itemsize=2)
    >>> round(t['x'].requested / t['x'].minimal, 2)
    1.41
"""

from typing import NamedTuple

from mmevo.ops.triton_kernels import block_w, strip_rows

# The H200's L2 and DRAM bandwidth (the roofline of docs/benchmarks.md).
L2_BYTES = 50 * 2**20
DRAM_BYTES_PER_S = 4.3e12


class Traffic(NamedTuple):
    """Bytes of one operand: minimal, requested, L2-aware (see module)."""

    minimal: int
    requested: int
    l2: int


def _blocks(size, block):
    return [range(s, min(s + block, size)) for s in range(0, size, block)]


def _tiles(map_hw, window, block_p, transpose):
    """Row strips and column blocks of the programs over ``map_hw``."""
    bw = block_w(map_hw[1])
    tile_rows = block_p // bw
    rows = strip_rows(
        window.kernel_size, window.stride, window.dilation, transpose
    )
    strip = -(-rows // tile_rows) * tile_rows
    return _blocks(map_hw[0], strip), _blocks(map_hw[1], bw)


def _window(out_idx, size, w):
    """Input indices (in [0, size)) the taps of outputs ``out_idx`` read."""
    return {
        o * w.stride - w.padding + u * w.dilation
        for o in out_idx
        for u in range(w.kernel_size)
    } & set(range(size))


def _sources(in_idx, size, w):
    """Per tap u, the outputs (in [0, size)) whose tap u reads ``in_idx``."""
    out = []
    for u in range(w.kernel_size):
        t = [h + w.padding - u * w.dilation for h in in_idx]
        out.append(
            {x // w.stride for x in t if x >= 0 and x % w.stride == 0}
            & set(range(size))
        )
    return out


def _with_l2(parts, n_cb, n_programs):
    """``{operand: (minimal, requested, touched)}`` to Traffic, with the
    L2 rule of the module docstring (neighbours ``n_cb`` programs apart)."""
    per_program = sum(p[1] for p in parts.values()) / max(n_programs, 1)
    fits = n_cb * per_program <= L2_BYTES / 2
    return {
        k: Traffic(m, r, t if fits else r) for k, (m, r, t) in parts.items()
    }


def _forward_x(batch, channels, in_hw, out_hw, window, block_p):
    """(requested, touched) elements of X by the output-strip kernels, and
    the column blocks and programs / (batch * groups)."""
    strips, cbs = _tiles(out_hw, window, block_p, False)
    rows = [_window(s, in_hw[0], window) for s in strips]
    cols = [_window(c, in_hw[1], window) for c in cbs]
    req = sum(map(len, rows)) * sum(map(len, cols))
    touched = len(set().union(*rows)) * len(set().union(*cols))
    return (
        batch * channels * req,
        batch * channels * touched,
        len(cbs),
        len(strips) * len(cbs),
    )


def aggregate(
    batch,
    channels,
    groups,
    in_hw,
    window,
    block_p,
    itemsize,
    kernel_itemsize=None,
):
    """Traffic of ``triton_backend.aggregate`` (Y = A(X, W)).

    Args:
        batch, channels, groups (int): B, C, G.
        in_hw (tuple[int, int]): X's map (zero padding).
        window (Window): the window (zero padding).
        block_p (int): the config's ``BLOCK_P``.
        itemsize (int): bytes of an element of X and Y.
        kernel_itemsize (int | None): of W, if not ``itemsize``.

    Returns:
        dict[str, Traffic]: ``x``, ``w`` (loads), ``y`` (store).
    """
    kernel_size = window.kernel_size
    out_hw = tuple(window.output_size(s) for s in in_hw)
    P = out_hw[0] * out_hw[1]
    req, touched, n_cb, n_prog = _forward_x(
        batch, channels, in_hw, out_hw, window, block_p
    )
    wsize = kernel_itemsize or itemsize
    n_w = batch * groups * kernel_size**2 * P
    n_x = batch * channels * in_hw[0] * in_hw[1]
    n_y = batch * channels * P
    return _with_l2(
        dict(
            x=(n_x * itemsize, req * itemsize, touched * itemsize),
            w=(n_w * wsize,) * 3,
            y=(n_y * itemsize,) * 3,
        ),
        n_cb,
        batch * groups * n_prog,
    )


def correlate(
    batch,
    channels,
    groups,
    in_hw,
    window,
    block_p,
    itemsize,
    out_itemsize=None,
):
    """Traffic of ``triton_backend.correlate`` (Corr(Q, X)); the arguments
    of :func:`aggregate`, ``out_itemsize`` for fp32 logits.

    Returns:
        dict[str, Traffic]: ``q``, ``x`` (loads), ``out`` (store).
    """
    kernel_size = window.kernel_size
    out_hw = tuple(window.output_size(s) for s in in_hw)
    P = out_hw[0] * out_hw[1]
    req, touched, n_cb, n_prog = _forward_x(
        batch, channels, in_hw, out_hw, window, block_p
    )
    n_q = batch * channels * P
    n_o = batch * groups * kernel_size**2 * P
    n_x = batch * channels * in_hw[0] * in_hw[1]
    return _with_l2(
        dict(
            q=(n_q * itemsize,) * 3,
            x=(n_x * itemsize, req * itemsize, touched * itemsize),
            out=(n_o * (out_itemsize or itemsize),) * 3,
        ),
        n_cb,
        batch * groups * n_prog,
    )


def aggregate_transpose(
    batch,
    channels,
    groups,
    in_hw,
    window,
    block_p,
    itemsize,
    kernel_itemsize=None,
):
    """Traffic of ``triton_backend.aggregate_transpose`` (grad_X = At(G, W));
    the arguments of :func:`aggregate` (``in_hw``: grad_X's map).

    Returns:
        dict[str, Traffic]: ``grad``, ``w`` (loads), ``grad_x`` (store).
    """
    kernel_size = window.kernel_size
    out_hw = tuple(window.output_size(s) for s in in_hw)
    strips, cbs = _tiles(in_hw, window, block_p, True)
    rows = [_sources(s, out_hw[0], window) for s in strips]
    cols = [_sources(c, out_hw[1], window) for c in cbs]
    # W: tap (u, v) of output (i, j) is one address per tap.
    w_req = sum(len(r) for s in rows for r in s) * sum(
        len(c) for s in cols for c in s
    )
    unions = ([set().union(*s) for s in rows], [set().union(*s) for s in cols])
    g_req = sum(map(len, unions[0])) * sum(map(len, unions[1]))
    g_touched = len(set().union(*unions[0])) * len(set().union(*unions[1]))
    wsize = kernel_itemsize or itemsize
    P = out_hw[0] * out_hw[1]
    n_g = batch * channels * P
    n_w = batch * groups * kernel_size**2 * P
    n_x = batch * channels * in_hw[0] * in_hw[1]
    return _with_l2(
        dict(
            grad=(
                n_g * itemsize,
                batch * channels * g_req * itemsize,
                batch * channels * g_touched * itemsize,
            ),
            w=(n_w * wsize,) + (batch * groups * w_req * wsize,) * 2,
            grad_x=(n_x * itemsize,) * 3,
        ),
        len(cbs),
        batch * groups * len(strips) * len(cbs),
    )


KERNELS = {
    'aggregate': aggregate,
    'aggregate_transpose': aggregate_transpose,
    'correlate': correlate,
}


def roofline_seconds(traffic):
    """The time the minimal bytes of ``traffic`` (one launch) take at
    :data:`DRAM_BYTES_PER_S`."""
    return sum(t.minimal for t in traffic.values()) / DRAM_BYTES_PER_S
