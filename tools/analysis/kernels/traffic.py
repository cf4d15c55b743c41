"""DRAM traffic of the Triton kernels, modelled from their tiling.

One function per kernel of :mod:`mmevo.ops.triton_kernels`, using its own
tiling helpers (:func:`~mmevo.ops.triton_kernels.block_w`,
:func:`~mmevo.ops.triton_kernels.strip_rows`), and of the fused
involution's :mod:`mmevo.ops.triton_fused` (:func:`fused_forward`,
:func:`fused_backward`, with :func:`~mmevo.ops.triton_fused.tile_shape`),
so the model changes with the kernels. The fused kernels' minimum has no
kernel map: it is never written.
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
    1.43
"""

from typing import NamedTuple

from mmevo.ops.triton_fused import tile_shape
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


def _fused_tiles(in_hw, window, reduced, tile):
    """The output map, the fused kernels' tile and, per axis, the tiles'
    output lines (``blocks``), the input lines their windows read
    (``reads``) and the output lines the taps of their input tiles come
    from, with their own (``sources``)."""
    out_hw = tuple(window.output_size(s) for s in in_hw)
    k, s, d = window.kernel_size, window.stride, window.dilation
    tile = tile or tile_shape(tuple(in_hw), out_hw, k, s, d, reduced)
    axes = []
    for n_in, n_out, t in zip(in_hw, out_hw, tile, strict=True):
        blocks = _blocks(n_out, t)
        inputs = [range(s * b[0], min(s * b[-1] + s, n_in)) for b in blocks]
        axes.append(
            dict(
                blocks=blocks,
                reads=[_window(b, n_in, window) for b in blocks],
                sources=[
                    set(b).union(*_sources(i, n_out, window))
                    for b, i in zip(blocks, inputs, strict=True)
                ],
            )
        )
    return out_hw, tile, axes


def _area(axes, key):
    """(summed over the tiles, union) positions of ``key``'s rectangles."""
    rows, cols = (a[key] for a in axes)
    per_tile = sum(map(len, rows)) * sum(map(len, cols))
    return per_tile, len(set().union(*rows)) * len(set().union(*cols))


def fused_forward(
    batch,
    channels,
    groups,
    reduced,
    in_hw,
    window,
    block_c,
    itemsize,
    tile=None,
    bias=True,
):
    """Traffic of ``triton_fused.fused_involution_forward`` (Y = A(X, S z +
    b)): a program per (batch, group, ``block_c`` channels, tile) reads its
    tile of z's C_r channels and its group's rows of S.

    Args:
        batch, channels, groups (int): B, C, G.
        reduced (int): C_r, z's channels.
        in_hw (tuple[int, int]): X's map.
        window (Window): the op's "same" window
            (:func:`mmevo.ops.fused_involution.same_window`).
        block_c (int): the config's ``BLOCK_C``.
        itemsize (int): bytes of an element of every tensor.
        tile (tuple[int, int], optional): the kernel's ``tile`` (default
            :func:`~mmevo.ops.triton_fused.tile_shape`'s).
        bias (bool): the span convolution has a bias.

    Returns:
        dict[str, Traffic]: ``x``, ``z``, ``s``, ``bias`` (loads), ``y``
        (store).
    """
    out_hw, _, axes = _fused_tiles(in_hw, window, reduced, tile)
    P = out_hw[0] * out_hw[1]
    tiles = len(axes[0]['blocks']) * len(axes[1]['blocks'])
    kk = window.kernel_size**2
    outer = batch * groups * -(-channels // groups // block_c)
    x_req, x_touched = _area(axes, 'reads')
    n_x = batch * channels * in_hw[0] * in_hw[1]
    n_s, n_b = groups * kk * reduced, groups * kk if bias else 0
    parts = dict(
        x=(n_x, batch * channels * x_req, batch * channels * x_touched),
        z=(batch * reduced * P, outer * reduced * P, batch * reduced * P),
        s=(n_s, outer * tiles * n_s // groups, n_s),
        bias=(n_b, outer * tiles * n_b // groups, n_b),
        y=(batch * channels * P,) * 3,
    )
    parts = {k: tuple(n * itemsize for n in v) for k, v in parts.items()}
    # z, S and b are re-read by the next channel block's or group's
    # programs, ``tiles`` programs later
    return _with_l2(parts, tiles, outer * tiles)


def fused_backward(
    batch,
    channels,
    groups,
    reduced,
    in_hw,
    window,
    itemsize,
    tile=None,
    bias=True,
):
    """Traffic of ``triton_fused.fused_involution_backward``: a program per
    (batch, tile) reads grad_y and z over its tile and the sources of its
    input tile's taps, x over its tile's windows and the whole of S, and
    writes grad_x (its input tile), grad_z (its tile) and its partials of
    grad_S and grad_b (fp32 at least; minimal: the gradients once).

    Args:
        batch, channels, groups, reduced, in_hw, window, itemsize, tile,
            bias: as :func:`fused_forward`'s.

    Returns:
        dict[str, Traffic]: ``grad``, ``x``, ``z``, ``s``, ``bias``
        (loads), ``grad_x``, ``grad_z`` (stores), ``grad_s``, ``grad_b``
        (the partials, read and written).
    """
    out_hw, _, axes = _fused_tiles(in_hw, window, reduced, tile)
    P = out_hw[0] * out_hw[1]
    programs = batch * len(axes[0]['blocks']) * len(axes[1]['blocks'])
    rows = groups * window.kernel_size**2
    acc = max(itemsize, 4)
    x_req, x_touched = _area(axes, 'reads')
    g_req, g_touched = _area(axes, 'sources')
    n_x = batch * channels * in_hw[0] * in_hw[1]
    n_s = rows * reduced
    parts = dict(
        grad=(batch * channels * P, g_req, g_touched),
        x=(n_x, x_req, x_touched),
        z=(batch * reduced * P, g_req, g_touched),
    )
    scale = dict(grad=channels, x=channels, z=reduced)
    parts = {
        k: (m * itemsize, *(n * batch * scale[k] * itemsize for n in rt))
        for k, (m, *rt) in parts.items()
    }
    for k, n in dict(s=n_s, bias=rows if bias else 0).items():
        parts[k] = (n * itemsize, programs * n * itemsize, n * itemsize)
    parts['grad_x'] = (n_x * itemsize,) * 3
    parts['grad_z'] = (batch * reduced * P * itemsize,) * 3
    for k, n in dict(grad_s=n_s, grad_b=rows).items():
        parts[k] = (n * acc,) + (programs * n * acc,) * 2
    # a tile's halo is shared with the next tile row, n_tw programs later
    return _with_l2(parts, len(axes[1]['blocks']), programs)


FUSED_KERNELS = {'forward': fused_forward, 'backward': fused_backward}


def roofline_seconds(traffic):
    """The time the minimal bytes of ``traffic`` (one launch) take at
    :data:`DRAM_BYTES_PER_S`."""
    return sum(t.minimal for t in traffic.values()) / DRAM_BYTES_PER_S
