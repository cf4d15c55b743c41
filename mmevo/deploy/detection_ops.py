"""NMS and RoIAlign as operators of their own, ``torch.ops.mmevo.nms`` and
``torch.ops.mmevo.roi_align``: mmcv's kernels in PyTorch, standard ONNX
operators under both exporters (mmcv's are pybind functions, which
``torch.export`` cannot trace, and its NMS has no ONNX symbolic).

Importing this module defines the two operators (``torch.library``);
their TorchScript symbolics are registered by
:func:`register_onnx_symbolics`, which :func:`mmevo.deploy.export_onnx`
calls, and the dynamo exporter takes :data:`ONNX_TRANSLATIONS`.
"""

import functools
import sys
from collections.abc import Sequence

import torch

OPSET_VERSION = 18


@torch.library.custom_op(
    'mmevo::nms',
    mutates_args=(),
    schema='(Tensor boxes, Tensor scores, float iou_threshold) -> Tensor',
)
def nms(boxes, scores, iou_threshold):
    """The indices of the boxes (N, 4) that NMS keeps, by descending score
    (mmcv's ``nms``); ONNX's ``NonMaxSuppression`` in an export.

    Example:
        >>> keep = nms(boxes, scores, 0.7)
    """
    import mmcv.ops

    _check_nms(boxes, scores)
    return mmcv.ops.nms(boxes, scores, iou_threshold)[1]


@torch.library.custom_op(
    'mmevo::roi_align',
    mutates_args=(),
    schema='(Tensor feats, Tensor rois, int[] output_size, '
    'float spatial_scale, int sampling_ratio, bool aligned) -> Tensor',
)
def roi_align(
    feats, rois, output_size, spatial_scale, sampling_ratio, aligned
):
    """mmcv's ``roi_align`` (``pool_mode='avg'``) of the RoIs (K, 5: image
    index, x1, y1, x2, y2); ONNX's ``RoiAlign`` in an export.

    Example:
        >>> feats = roi_align(x, rois, [7, 7], 1 / 4, 0, True)
    """
    import mmcv.ops

    _check_roi_align(feats, rois, output_size)
    return mmcv.ops.roi_align(
        feats, rois, output_size, spatial_scale, sampling_ratio, 'avg', aligned
    )


def _check_nms(boxes, scores):
    if boxes.dim() != 2 or boxes.shape[1] != 4:
        raise ValueError(f'boxes must be (N, 4), got {tuple(boxes.shape)}')
    if scores.shape != boxes.shape[:1]:
        raise ValueError(
            f'scores must be (N, ) for boxes (N, 4), got '
            f'{tuple(scores.shape)} for {tuple(boxes.shape)}'
        )


def _check_roi_align(feats, rois, output_size):
    if feats.dim() != 4:
        raise ValueError(
            f'feats must be (B, C, H, W), got {tuple(feats.shape)}'
        )
    if rois.dim() != 2 or rois.shape[1] != 5:
        raise ValueError(f'rois must be (K, 5), got {tuple(rois.shape)}')
    if len(output_size) != 2:
        raise ValueError(
            f'output_size must be (h, w), got {tuple(output_size)}'
        )


@nms.register_fake
def _(boxes, scores, iou_threshold):
    _check_nms(boxes, scores)
    kept = torch.library.get_ctx().new_dynamic_size()
    return boxes.new_empty(kept, dtype=torch.long)


@roi_align.register_fake
def _(feats, rois, output_size, spatial_scale, sampling_ratio, aligned):
    _check_roi_align(feats, rois, output_size)
    return feats.new_empty(rois.shape[0], feats.shape[1], *output_size)


def _nms_graph(op, boxes, scores, iou_threshold):
    """``nms`` in ONNX operators built by ``op(type, *inputs, **attrs)``
    (Python numbers and lists as inputs are constants)."""
    selected = op(
        'NonMaxSuppression',
        op('Unsqueeze', boxes, [0]),
        op('Unsqueeze', scores, [0, 1]),
        [sys.maxsize],
        [float(iou_threshold)],
    )
    # (batch, class, box) rows: the box column
    return op('Gather', selected, 2, axis=1)


def _roi_align_graph(
    op, feats, rois, output_size, spatial_scale, sampling_ratio, aligned
):
    """``roi_align`` in ONNX operators (see :func:`_nms_graph`), with the
    coordinate mode of ``aligned`` (mmcv's symbolic shifts the boxes itself
    for opset 10, which opset 16's default ``half_pixel`` would shift
    again)."""
    batch = op(
        'Cast',
        op('Gather', rois, 0, axis=1),
        to=int(torch.onnx.TensorProtoDataType.INT64),
    )
    return op(
        'RoiAlign',
        feats,
        op('Gather', rois, [1, 2, 3, 4], axis=1),
        batch,
        coordinate_transformation_mode='half_pixel'
        if aligned
        else 'output_half_pixel',
        mode='avg',
        output_height=output_size[0],
        output_width=output_size[1],
        sampling_ratio=max(0, sampling_ratio),
        spatial_scale=float(spatial_scale),
    )


def _torchscript_op(g):
    """``op`` of the graphs above for a TorchScript symbolic's ``g``."""
    suffix = {int: 'i', float: 'f', str: 's'}

    def op(kind, *inputs, **attrs):
        inputs = [
            v
            if isinstance(v, torch._C.Value)
            else g.op('Constant', value_t=torch.tensor(v))
            for v in inputs
        ]
        return g.op(
            kind,
            *inputs,
            **{f'{k}_{suffix[type(v)]}': v for k, v in attrs.items()},
        )

    return op


def _onnxscript_op(kind, *inputs, **attrs):
    """``op`` of the graphs above in an onnxscript translation."""
    import onnxscript

    opset = onnxscript.values.Opset('', OPSET_VERSION)
    inputs = [
        opset.Constant(value=onnxscript.ir.tensor(torch.tensor(v).numpy()))
        if isinstance(v, (int, float, list))
        else v
        for v in inputs
    ]
    return getattr(opset, kind)(*inputs, **attrs)


@torch.onnx.symbolic_helper.parse_args('v', 'v', 'f')
def _nms_torchscript(g, boxes, scores, iou_threshold):
    return _nms_graph(_torchscript_op(g), boxes, scores, iou_threshold)


@torch.onnx.symbolic_helper.parse_args('v', 'v', 'is', 'f', 'i', 'b')
def _roi_align_torchscript(
    g, feats, rois, output_size, spatial_scale, sampling_ratio, aligned
):
    return _roi_align_graph(
        _torchscript_op(g),
        feats,
        rois,
        output_size,
        spatial_scale,
        sampling_ratio,
        aligned,
    )


def _nms_onnxscript(boxes, scores, iou_threshold: float):
    return _nms_graph(_onnxscript_op, boxes, scores, iou_threshold)


def _roi_align_onnxscript(
    feats,
    rois,
    output_size: Sequence[int],
    spatial_scale: float,
    sampling_ratio: int,
    aligned: bool,
):
    return _roi_align_graph(
        _onnxscript_op,
        feats,
        rois,
        output_size,
        spatial_scale,
        sampling_ratio,
        aligned,
    )


@functools.cache
def register_onnx_symbolics():
    """Register the TorchScript exporter's symbolics of :func:`nms` and
    :func:`roi_align` (once; later calls do nothing).

    Example:
        >>> register_onnx_symbolics()
        >>> torch.onnx.export(model, (x, ), 'det.onnx', dynamo=False)
    """
    # from opset 16: RoiAlign's coordinate_transformation_mode
    torch.onnx.register_custom_op_symbolic('mmevo::nms', _nms_torchscript, 16)
    torch.onnx.register_custom_op_symbolic(
        'mmevo::roi_align', _roi_align_torchscript, 16
    )


#: the dynamo exporter's ``custom_translation_table`` for the ops above
ONNX_TRANSLATIONS = {
    torch.ops.mmevo.nms.default: _nms_onnxscript,
    torch.ops.mmevo.roi_align.default: _roi_align_onnxscript,
}
