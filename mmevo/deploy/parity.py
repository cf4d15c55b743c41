"""How far an exported graph's outputs are from PyTorch's, as the export
tools check them."""

import torch


def max_difference(outputs, expected, rows=False):
    """The largest difference of ``outputs`` to ``expected`` (tuples of
    tensors), relative to each expected output's largest value.

    Args:
        outputs (tuple[Tensor]): the exported graph's.
        expected (tuple[Tensor]): PyTorch's.
        rows (bool): the outputs of a two-stage detector's graph: rows put
            in ``expected``'s order first (:func:`match_rows`).

    Returns:
        tuple[float, int]: the difference and the output it is in.

    Raises:
        ValueError: the outputs' count or shapes differ.

    Example:
        >>> err, i = max_difference(OnnxModel(path)(x), model(x))
    """
    shapes = [tuple(t.shape) for t in outputs]
    if shapes != [tuple(t.shape) for t in expected]:
        raise ValueError(
            f"outputs of shapes {shapes}, PyTorch's "
            f'{[tuple(t.shape) for t in expected]}'
        )
    if rows:
        outputs = match_rows(outputs, expected)
    errs = [
        relative_difference(o, r)
        for o, r in zip(outputs, expected, strict=True)
    ]
    err = max(errs, default=0.0)
    return err, errs.index(err) if errs else 0


def relative_difference(output, expected):
    """The largest of ``|output - expected|`` relative to ``expected``'s
    largest finite value; ``inf`` where one of the two is NaN or infinite
    and the other is not (a NaN would otherwise compare as no difference:
    an export reading memory it never wrote passed a tolerance check).

    Example:
        >>> relative_difference(torch.tensor([1., float('nan')]),
        ...                     torch.ones(2))
        inf
    """
    if not output.numel():
        return 0.0
    o, r = output.double(), expected.double()
    same = (o == r) | (o.isnan() & r.isnan())  # equal infinities, NaNs
    diff = (o - r).abs()
    diff = torch.where(same, 0.0, diff.masked_fill(diff.isnan(), torch.inf))
    finite = r[r.isfinite()]
    scale = finite.abs().max() if finite.numel() else r.new_tensor(1.0)
    return float(diff.max() / scale.clamp(min=1e-6))


def check_outputs(model, runtime, inputs, kind):
    """Run ``model`` and its export ``runtime`` on each of ``inputs``: the
    outputs must agree within 1e-4 of each output's largest value (1e-2 for
    a two-stage detector: NMS is no continuous function, of two
    overlapping proposals whose scores differ by a float rounding either
    may stay, the detections then differ by about the gap between them).

    Args:
        model (nn.Module): the exported model (tuple outputs).
        runtime (callable): the export, called on a tensor.
        inputs (list[Tensor]): the inputs.
        kind (str): the model's :func:`mmevo.deploy.model_kind`.

    Returns:
        list[float]: the largest difference on each input.

    Raises:
        ValueError: naming the input and the output that differ, or the
            runtime's error at that input.

    Example:
        >>> check_outputs(model, AotiModel(path), [x, other_x], 'det')
    """
    tolerance = 1e-2 if kind == 'two-stage' else 1e-4
    errs = []
    for x in inputs:
        with torch.no_grad():
            expected = model(x)
        try:
            outputs = runtime(x)
        except Exception as e:  # the runtime's own errors
            lines = str(e).strip().splitlines() or [type(e).__name__]
            raise ValueError(
                f'fails at input {tuple(x.shape)}: {lines[0]}'
            ) from e
        try:
            err, i = max_difference(
                outputs, expected, rows=kind == 'two-stage'
            )
        except ValueError as e:
            raise ValueError(f'gives {e} at input {tuple(x.shape)}') from e
        if err > tolerance:
            raise ValueError(
                f'differs from PyTorch by {err:.1e} at input '
                f'{tuple(x.shape)} (output {i} of {len(expected)})'
            )
        errs.append(err)
    return errs


def match_rows(outputs, reference):
    """:func:`two_stage_forward`'s or :func:`two_stage_detections`'
    ``outputs`` with their boxes in the order of ``reference``'s, so that
    two runs compare row by row: boxes of equal score leave NMS in either
    order (mmcv's and onnxruntime's sorts differ on ties). Each reference
    box takes the nearest box (coordinates, score or class scores, class).

    Args:
        outputs (tuple[Tensor]): of one image; the first holds the boxes
            (N, 5), the others a row per box (or per first box).
        reference (tuple[Tensor]): the same from the other run.

    Returns:
        tuple[Tensor]: ``outputs``' rows reordered.

    Example:
        >>> ours = match_rows(OnnxModel(path)(x), expected)
    """

    def keys(outs, n):
        keys = [outs[0][:n, 1:], outs[1][:n].reshape(n, -1)]
        if not outs[2].is_floating_point():  # detections: a class apart
            keys.append(outs[2][:n, None] * 1e6)
        return torch.cat([k.double() for k in keys], 1)

    def order(n):
        n = min(n, len(outputs[0]))
        return torch.cdist(keys(reference, n), keys(outputs, n)).argmin(1)

    return tuple(t[order(len(t))] for t in outputs)
