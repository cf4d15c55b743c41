"""ONNX deployment helpers: export with plain ``torch.onnx.export``, run in
onnxruntime.

The evolution ops need no special argument to export (while
``torch.onnx.export`` runs they are standard ONNX operators, see
:mod:`mmevo.ops.export`); these helpers only choose the dynamic axes and
flatten the nested outputs of OpenMMLab models, e.g. the per-level lists of
``model(x, mode='tensor')``, into a tuple of tensors. Two-stage detectors
export whole with either exporter through :func:`two_stage_forward` or
:func:`two_stage_detections`: their NMS and RoIAlign are the operators
:func:`nms` and :func:`roi_align` (``torch.ops.mmevo``), which both
exporters write as standard ONNX operators.
While exporting, the modules whose stock graph would hold the example's
sizes run as the same numbers on symbolic sizes (:func:`_export_rewrites`):
mmseg's ``Upsample`` by its scale factor, not the Python-int size it
computes, and ``nn.AdaptiveAvgPool2d`` as :func:`adaptive_avg_pool2d`, so
Semantic FPN and UPerNet (pyramid pooling) export with dynamic H and W too.

Example:
    >>> model = TensorOutputs(detector.eval())   # mode='tensor', flattened
    >>> export_onnx(model, torch.randn(1, 3, 128, 128), 'det.onnx')
    >>> outputs = OnnxModel('det.onnx')(torch.randn(1, 3, 96, 160))
"""
import contextlib
import functools
import importlib.util
import sys
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from mmdet.models.task_modules.coders.delta_xywh_bbox_coder import delta2bbox
from torch import nn
from torch.nn.modules.utils import _pair
from torch.utils import _pytree as pytree

from mmevo.layers.base import EvolutionLayer

OPSET_VERSION = 18


class TensorOutputs(nn.Module):
    """A model's raw tensor outputs, flattened into one tuple.

    Args:
        model (nn.Module): an OpenMMLab model (called with ``mode='tensor'``)
            or any module when ``forward`` is given.
        forward (callable, optional): ``forward(model, x)`` instead of
            ``model(x, mode='tensor')`` (two-stage detectors: default
            :func:`two_stage_forward`).
    """

    def __init__(self, model, forward=None):
        super().__init__()
        self.model = model
        if forward is None and hasattr(model, 'roi_head'):
            forward = two_stage_forward
        self._forward = forward
        # the model's mode: exporters restore the wrapper's mode afterwards
        self.train(model.training)

    def forward(self, x):
        if self._forward is not None:
            out = self._forward(self.model, x)
        else:
            out = self.model(x, mode='tensor')
        return tuple(pytree.tree_leaves(out))


def _layer_names(model):
    return {
        m: name
        for name, m in model.named_modules() if isinstance(m, EvolutionLayer)
    }


def export_onnx(model,
                x,
                path,
                dynamic=True,
                dynamo=True,
                opset_version=OPSET_VERSION):
    """``torch.onnx.export(model, (x, ), path)`` with H and W dynamic.

    Args:
        model (nn.Module): in eval mode; returns a tensor or a tuple of them.
        x (Tensor): the example input (B, C, H, W); B stays fixed.
        path (str): the ``.onnx`` file to write.
        dynamic (bool): H and W of the input (and of every 4-d output)
            dynamic, so one export serves every size. Default: True.
        dynamo (bool): the dynamo exporter (torch's default; given
            :data:`ONNX_TRANSLATIONS` for :func:`nms` and :func:`roi_align`)
            or the TorchScript one. Default: True.
        opset_version (int): Default: 18.

    Raises:
        RuntimeError: naming the evolution layer (and its settings) that
            was running when the export failed.
    """
    names = _layer_names(model)
    running = []
    handles = [
        m.register_forward_pre_hook(lambda m, _: running.append(m))
        for m in names
    ] + [
        m.register_forward_hook(lambda m, _, __: running.remove(m))
        for m in names
    ]
    try:
        kwargs = {}
        if dynamic and dynamo:
            dim = torch.export.Dim.DYNAMIC
            kwargs['dynamic_shapes'] = ({2: dim, 3: dim}, )
        elif dynamic:
            kwargs = _dynamic_axes(model, x)
        if dynamo:
            kwargs['custom_translation_table'] = ONNX_TRANSLATIONS
        with torch.no_grad(), _export_rewrites():
            torch.onnx.export(
                model, (x, ),
                path,
                dynamo=dynamo,
                opset_version=opset_version,
                **kwargs)
    except Exception as e:
        if not running:
            raise
        layer = running[-1]
        raise RuntimeError(
            f'ONNX export failed in layer {names[layer]!r} '
            f'({type(layer).__name__}: kernel_size={layer.kernel_size}, '
            f'stride={layer.stride}, dilation={layer.dilation}, '
            f'padding_mode={layer.padding_mode!r}): {e}') from e
    finally:
        for h in handles:
            h.remove()


def adaptive_avg_pool2d(x, output_size):
    """``F.adaptive_avg_pool2d(x, output_size)`` in standard operators on
    the symbolic input size, for a graph that serves every size.

    PyTorch's bins (row ``i`` of ``o`` averages rows ``floor(i * H / o)``
    to ``ceil((i + 1) * H / o)``, overlapping when ``H`` is not a multiple
    of ``o``, repeated when ``H < o``) as 0/1 matrices built in the graph
    from ``arange`` of the input size: two MatMuls sum the bins, one Div
    by the bin areas averages them. The exporters' own adaptive pooling
    needs the example's sizes: the TorchScript one refuses dynamic ones,
    the dynamo one keeps the example's bins (wrong numbers at other sizes).

    Args:
        x (Tensor): (B, C, H, W) or (C, H, W).
        output_size (int | tuple[int | None, int | None]): the output's
            (h, w); ``None`` keeps the input's size.

    Returns:
        Tensor: (B, C, h, w) or (C, h, w).

    Example:
        >>> x = torch.randn(1, 8, 13, 7)
        >>> torch.allclose(adaptive_avg_pool2d(x, 6),
        ...                F.adaptive_avg_pool2d(x, 6), atol=1e-6)
        True
    """
    out_h, out_w = _pair(output_size)
    if not all(
            o is None or isinstance(o, int) and o >= 1
            for o in (out_h, out_w)):
        raise ValueError(f'output_size must be a positive int, None or a '
                         f'pair of them, got {output_size!r}')
    sums, area = x, 1
    if out_h is not None:
        rows, counts = _bins(x.shape[-2], out_h, x)
        sums, area = rows @ sums, counts[:, None]
    if out_w is not None:
        cols, counts = _bins(x.shape[-1], out_w, x)
        sums, area = sums @ cols.transpose(0, 1), area * counts
    return sums / area


def _bins(size, out, like):
    """(out, size) 0/1 matrix of the input rows in each of the ``out``
    adaptive pooling bins, and the bins' lengths."""
    i = torch.arange(out, device=like.device)
    start = torch.div(i * size, out, rounding_mode='floor')
    end = torch.div((i + 1) * size + out - 1, out, rounding_mode='floor')
    pos = torch.arange(size, device=like.device)
    inside = (pos >= start[:, None]) & (pos < end[:, None])
    return inside.to(like.dtype), (end - start).to(like.dtype)


def _pool(self, x, stock):
    """``nn.AdaptiveAvgPool2d`` while exporting: :func:`adaptive_avg_pool2d`
    (e.g. mmseg's pyramid pooling, 2, 3 and 6 bins); 1 x 1 stays the stock
    global average, which exports for any size. The module, not mmseg's
    ``PPM``: every head that pools with it (PPM, PSPHead, ...) exports with
    dynamic sizes, and ``F.adaptive_avg_pool2d`` itself stays stock."""
    if _pair(self.output_size) == (1, 1):
        return stock(self, x)
    return adaptive_avg_pool2d(x, self.output_size)


def _upsample(self, x, stock):
    """mmseg's ``Upsample(scale_factor=s)`` while exporting: interpolates by
    ``s`` itself, as its own forward turns ``H * s`` into a Python int. The
    same numbers for an integer ``s`` (output size and sampling grid are
    then those of the size); any other ``Upsample`` stock."""
    s = self.scale_factor
    if self.size or not isinstance(s, float) or not s.is_integer():
        return stock(self, x)
    return F.interpolate(
        x, scale_factor=s, mode=self.mode, align_corners=self.align_corners)


@contextlib.contextmanager
def _export_rewrites():
    """While exporting, module forwards whose stock graph would hold the
    example's sizes (Python ints the exporters freeze, or ops they export
    for static sizes only) run as the same numbers on symbolic sizes:
    ``nn.AdaptiveAvgPool2d`` (:func:`_pool`) and mmseg's ``Upsample``
    (:func:`_upsample`). Patched on the classes for the export only: eager
    models run their stock forwards."""
    rewrites = {nn.AdaptiveAvgPool2d: _pool}
    if importlib.util.find_spec('mmseg') is not None:
        from mmseg.models.utils import Upsample
        rewrites[Upsample] = _upsample
    stock = {cls: cls.forward for cls in rewrites}
    for cls, rewrite in rewrites.items():
        cls.forward = functools.partialmethod(rewrite, stock=stock[cls])
    try:
        yield
    finally:
        for cls, forward in stock.items():
            cls.forward = forward


def _dynamic_axes(model, x):
    """TorchScript exporter arguments: H and W of the input and of every 4-d
    output dynamic."""
    with torch.no_grad():
        outs = model(x)
    outs = outs if isinstance(outs, (tuple, list)) else (outs, )
    outputs = [f'output{i}' for i in range(len(outs))]
    return dict(
        input_names=['input'],
        output_names=outputs,
        dynamic_axes={
            name: {
                2: f'{name}_height',
                3: f'{name}_width'
            }
            for name, t in zip(['input'] + outputs, [x, *outs]) if t.dim() == 4
        })


class OnnxModel:
    """An ONNX model in onnxruntime (CPU), called like the PyTorch one.

    Args:
        path (str): the ``.onnx`` file.
        threads (int, optional): onnxruntime's intra-op threads; default:
            torch's thread count.

    Example:
        >>> outputs = OnnxModel('model.onnx')(torch.randn(1, 3, 64, 64))
    """

    def __init__(self, path, threads=None):
        import onnxruntime as ort
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads or torch.get_num_threads()
        options.inter_op_num_threads = 1
        self.session = ort.InferenceSession(
            path, options, providers=['CPUExecutionProvider'])
        self.input_name = self.session.get_inputs()[0].name

    def __call__(self, x):
        """Tuple of output tensors for the input ``x`` (a tensor)."""
        outs = self.session.run(None,
                                {self.input_name: x.detach().cpu().numpy()})
        return tuple(torch.from_numpy(o) for o in outs)


# NMS and RoIAlign as operators of their own, ``torch.ops.mmevo.nms`` and
# ``torch.ops.mmevo.roi_align``: mmcv's kernels in PyTorch, standard ONNX
# operators under both exporters (mmcv's are pybind functions, which
# ``torch.export`` cannot trace, and its NMS has no ONNX symbolic).
@torch.library.custom_op(
    'mmevo::nms',
    mutates_args=(),
    schema='(Tensor boxes, Tensor scores, float iou_threshold) -> Tensor')
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
    'float spatial_scale, int sampling_ratio, bool aligned) -> Tensor')
def roi_align(feats, rois, output_size, spatial_scale, sampling_ratio,
              aligned):
    """mmcv's ``roi_align`` (``pool_mode='avg'``) of the RoIs (K, 5: image
    index, x1, y1, x2, y2); ONNX's ``RoiAlign`` in an export.

    Example:
        >>> feats = roi_align(x, rois, [7, 7], 1 / 4, 0, True)
    """
    import mmcv.ops
    _check_roi_align(feats, rois, output_size)
    return mmcv.ops.roi_align(feats, rois, output_size, spatial_scale,
                              sampling_ratio, 'avg', aligned)


def _check_nms(boxes, scores):
    if boxes.dim() != 2 or boxes.shape[1] != 4:
        raise ValueError(f'boxes must be (N, 4), got {tuple(boxes.shape)}')
    if scores.shape != boxes.shape[:1]:
        raise ValueError(f'scores must be (N, ) for boxes (N, 4), got '
                         f'{tuple(scores.shape)} for {tuple(boxes.shape)}')


def _check_roi_align(feats, rois, output_size):
    if feats.dim() != 4:
        raise ValueError(
            f'feats must be (B, C, H, W), got {tuple(feats.shape)}')
    if rois.dim() != 2 or rois.shape[1] != 5:
        raise ValueError(f'rois must be (K, 5), got {tuple(rois.shape)}')
    if len(output_size) != 2:
        raise ValueError(
            f'output_size must be (h, w), got {tuple(output_size)}')


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
    selected = op('NonMaxSuppression', op('Unsqueeze', boxes, [0]),
                  op('Unsqueeze', scores, [0, 1]), [sys.maxsize],
                  [float(iou_threshold)])
    # (batch, class, box) rows: the box column
    return op('Gather', selected, 2, axis=1)


def _roi_align_graph(op, feats, rois, output_size, spatial_scale,
                     sampling_ratio, aligned):
    """``roi_align`` in ONNX operators (see :func:`_nms_graph`), with the
    coordinate mode of ``aligned`` (mmcv's symbolic shifts the boxes itself
    for opset 10, which opset 16's default ``half_pixel`` would shift
    again)."""
    batch = op(
        'Cast',
        op('Gather', rois, 0, axis=1),
        to=int(torch.onnx.TensorProtoDataType.INT64))
    return op(
        'RoiAlign',
        feats,
        op('Gather', rois, [1, 2, 3, 4], axis=1),
        batch,
        coordinate_transformation_mode='half_pixel'
        if aligned else 'output_half_pixel',
        mode='avg',
        output_height=output_size[0],
        output_width=output_size[1],
        sampling_ratio=max(0, sampling_ratio),
        spatial_scale=float(spatial_scale))


def _torchscript_op(g):
    """``op`` of the graphs above for a TorchScript symbolic's ``g``."""
    suffix = {int: 'i', float: 'f', str: 's'}

    def op(kind, *inputs, **attrs):
        inputs = [
            v if isinstance(v, torch._C.Value) else g.op(
                'Constant', value_t=torch.tensor(v)) for v in inputs
        ]
        return g.op(kind, *inputs, **{
            f'{k}_{suffix[type(v)]}': v
            for k, v in attrs.items()
        })

    return op


def _onnxscript_op(kind, *inputs, **attrs):
    """``op`` of the graphs above in an onnxscript translation."""
    import onnxscript
    opset = onnxscript.values.Opset('', OPSET_VERSION)
    inputs = [
        opset.Constant(value=onnxscript.ir.tensor(torch.tensor(v).numpy()))
        if isinstance(v, (int, float, list)) else v for v in inputs
    ]
    return getattr(opset, kind)(*inputs, **attrs)


@torch.onnx.symbolic_helper.parse_args('v', 'v', 'f')
def _nms_torchscript(g, boxes, scores, iou_threshold):
    return _nms_graph(_torchscript_op(g), boxes, scores, iou_threshold)


@torch.onnx.symbolic_helper.parse_args('v', 'v', 'is', 'f', 'i', 'b')
def _roi_align_torchscript(g, feats, rois, output_size, spatial_scale,
                           sampling_ratio, aligned):
    return _roi_align_graph(
        _torchscript_op(g), feats, rois, output_size, spatial_scale,
        sampling_ratio, aligned)


def _nms_onnxscript(boxes, scores, iou_threshold: float):
    return _nms_graph(_onnxscript_op, boxes, scores, iou_threshold)


def _roi_align_onnxscript(feats, rois, output_size: Sequence[int],
                          spatial_scale: float, sampling_ratio: int,
                          aligned: bool):
    return _roi_align_graph(_onnxscript_op, feats, rois, output_size,
                            spatial_scale, sampling_ratio, aligned)


# from opset 16: RoiAlign's coordinate_transformation_mode
torch.onnx.register_custom_op_symbolic('mmevo::nms', _nms_torchscript, 16)
torch.onnx.register_custom_op_symbolic('mmevo::roi_align',
                                       _roi_align_torchscript, 16)

#: the dynamo exporter's ``custom_translation_table`` for the ops above
ONNX_TRANSLATIONS = {
    torch.ops.mmevo.nms.default: _nms_onnxscript,
    torch.ops.mmevo.roi_align.default: _roi_align_onnxscript,
}


def _roi_align(layer, feats, rois):
    if layer.pool_mode != 'avg':
        raise ValueError(f"RoIAlign pool_mode must be 'avg' to export (ONNX "
                         f"RoiAlign's max differs), got {layer.pool_mode!r}")
    return roi_align(feats, rois, list(layer.output_size),
                     float(layer.spatial_scale), int(layer.sampling_ratio),
                     bool(layer.aligned))


def _roi_features(extractor, feats, rois):
    """``SingleRoIExtractor(feats, rois)`` without its data-dependent
    branches: every RoI through every level's RoIAlign, masked to its own
    level (as exact: the other levels add zeros)."""
    feats = feats[:extractor.num_inputs]
    if len(feats) == 1:
        return _roi_align(extractor.roi_layers[0], feats[0], rois)
    levels = extractor.map_roi_levels(rois, len(feats))
    out = 0
    for i, layer in enumerate(extractor.roi_layers[:len(feats)]):
        mask = (levels == i).to(rois.dtype).view(-1, 1, 1, 1)
        out = out + _roi_align(layer, feats[i], rois) * mask
    return out


def _image_size(x):
    """(H, W) of the images ``x`` as a tensor of the graph under both
    exporters: the last entries of aranges (whose lengths TorchScript
    traces as sizes, torch.export as symbols)."""
    return torch.cat(
        [torch.arange(1, n + 1, device=x.device)[-1:] for n in x.shape[2:]])


def _extra_row(fn, *tensors):
    """``fn(*tensors)`` with a row of zeros appended to each tensor, and
    dropped from each output.

    The rows are as many as NMS keeps, which torch.export cannot tell from
    0; mmdet's ``delta2bbox`` and the batch norms of the heads branch on
    that, one more row makes their count at least 1. ``fn`` treats each row
    on its own, so the result is exact (and no head runs on no rows).
    """
    outs = fn(*[torch.cat([t, t.new_zeros(1, *t.shape[1:])]) for t in tensors])
    return pytree.tree_map(lambda t: t[:-1], outs)


def _decode(coder, priors, deltas, size):
    """``coder.decode(priors, deltas, max_shape=size)`` with the size a
    tensor of the graph (H and W stay dynamic)."""
    if type(coder).__name__ != 'DeltaXYWHBBoxCoder':
        raise ValueError(f'the box coder must be DeltaXYWHBBoxCoder to '
                         f'export, got {type(coder).__name__}')
    boxes = _extra_row(
        lambda priors, deltas: delta2bbox(
            priors,
            deltas,
            coder.means,
            coder.stds,
            add_ctr_clamp=coder.add_ctr_clamp,
            ctr_clamp=coder.ctr_clamp), priors, deltas)
    if coder.clip_border:
        limit = size.flip(0).repeat(2).to(boxes)
        boxes = torch.min(boxes.clamp(min=0), limit)
    return boxes


def _batched_nms(boxes, scores, ids, nms_cfg):
    """mmcv's ``batched_nms`` indices: one NMS on the boxes offset by id
    (what mmcv does below ``split_thr`` boxes, the same result above)."""
    if nms_cfg.get('type', 'nms') != 'nms' or nms_cfg.get('offset', 0):
        raise ValueError(f'the NMS must be plain nms (offset 0) to export, '
                         f'got {dict(nms_cfg)}')
    offset = 0
    if not nms_cfg.get('class_agnostic'):
        # a zero added: no error on no boxes (clipped boxes are >= 0)
        top = torch.cat([boxes.reshape(-1), boxes.new_zeros(1)]).max()
        offset = ids[:, None].to(boxes) * (top + 1)
    return nms(boxes + offset, scores, float(nms_cfg['iou_threshold']))


def _proposals(rpn_head, scores, deltas, size):
    """``RPNHead.predict_by_feat`` for one image, the branches on data
    (level sizes against ``nms_pre``, empty results) taken the same way for
    every input: top-k by a sort and a slice, small boxes dropped by a mask,
    the levels' NMS as one NMS on boxes offset by level."""
    cfg = rpn_head.test_cfg
    coder = rpn_head.bbox_coder
    nms_cfg = cfg.nms
    priors = rpn_head.prior_generator.grid_priors(
        [s.shape[-2:] for s in scores], scores[0].dtype, scores[0].device)
    nms_pre = cfg.get('nms_pre', -1)
    level_scores, level_boxes, level_priors, level_ids = [], [], [], []
    for level, (score, delta, prior) in enumerate(zip(scores, deltas, priors)):
        score = score.permute(1, 2, 0).reshape(-1, rpn_head.cls_out_channels)
        score = (
            score.sigmoid()
            if rpn_head.use_sigmoid_cls else score.softmax(-1)[:, :-1])
        score = score.reshape(-1)
        delta = delta.permute(1, 2, 0).reshape(-1, 4)
        if nms_pre > 0:
            score, order = score.sort(descending=True)
            score, order = score[:nms_pre], order[:nms_pre]
            delta, prior = delta[order], prior[order]
        level_scores.append(score)
        level_boxes.append(delta)
        level_priors.append(prior)
        level_ids.append(torch.full_like(score, level))
    score = torch.cat(level_scores)
    boxes = _decode(coder, torch.cat(level_priors), torch.cat(level_boxes),
                    size)
    ids = torch.cat(level_ids)
    if cfg.get('min_bbox_size', -1) >= 0:
        wh = boxes[:, 2:] - boxes[:, :2]
        valid = (wh > cfg.min_bbox_size).all(1)
        boxes, score, ids = boxes[valid], score[valid], ids[valid]
    keep = _batched_nms(boxes, score, ids, nms_cfg)
    return boxes[keep][:cfg.max_per_img]


def two_stage_forward(model, x):
    """The tensor outputs of a two-stage detector (Faster / Mask R-CNN),
    exportable end to end with either exporter.

    What ``model(x, mode='tensor')`` computes with each image's
    ``img_shape`` the input's height and width, rewritten so that one graph
    holds for every input: the RPN's proposals (top-k, decoding, NMS),
    RoIAlign and the box (and mask) head. No branch on data or on a size
    that data decide (the NMS's count), so ``torch.export`` traces it with
    H and W dynamic.

    Args:
        model (nn.Module): an mmdet ``TwoStageDetector`` with a
            ``StandardRoIHead``, in eval mode.
        x (Tensor): the preprocessed images (B, 3, H, W).

    Returns:
        tuple[Tensor]: ``rois`` (N, 5: image index, x1, y1, x2, y2, the
        proposals), ``cls_score`` (N, classes + 1), ``bbox_pred`` (N, 4 *
        classes) and with a mask head ``mask_preds`` of the first 100 RoIs
        (as ``mode='tensor'``).

    Example:
        >>> model = TensorOutputs(faster_rcnn.eval())  # two_stage_forward
        >>> export_onnx(model, x, 'faster-rcnn.onnx')
    """
    feats = model.extract_feat(x)
    rois = _rois(model, feats, x)
    head = model.roi_head
    outs = (rois, *_bbox_forward(head, feats, rois))
    if head.with_mask:
        outs = outs + (_mask_forward(head, feats, rois[:100]), )
    return outs


def _rois(model, feats, x):
    scores, deltas = model.rpn_head(feats)
    size = _image_size(x)
    rois = []
    for i in range(len(x)):
        boxes = _proposals(model.rpn_head, [s[i] for s in scores],
                           [d[i] for d in deltas], size)
        rois.append(torch.cat([torch.full_like(boxes[:, :1], i), boxes], 1))
    return torch.cat(rois)


def _head_forward(head, extractor, roi_head, feats, rois):
    """``roi_head`` (the box or mask head of the RoI head ``head``) on the
    features of ``rois`` (their count not 0 to torch.export: see
    :func:`_extra_row`)."""

    def forward(rois):
        roi_feats = _roi_features(extractor, feats, rois)
        if head.with_shared_head:
            roi_feats = head.shared_head(roi_feats)
        return roi_head(roi_feats)

    return _extra_row(forward, rois)


def _bbox_forward(head, feats, rois):
    return _head_forward(head, head.bbox_roi_extractor, head.bbox_head, feats,
                         rois)


def _mask_forward(head, feats, rois):
    extractor = (
        head.bbox_roi_extractor
        if head.share_roi_extractor else head.mask_roi_extractor)
    return _head_forward(head, extractor, head.mask_head, feats, rois)


def _detections(bbox_head, rois, cls_score, bbox_pred, size, cfg):
    """``bbox_head.predict_by_feat`` of one image (no rescaling):
    decoding, the score threshold and the class-wise NMS."""
    if bbox_head.custom_cls_channels:
        raise ValueError('a box head with custom class channels does not '
                         'export')
    classes = bbox_head.num_classes
    per_class = 1 if bbox_head.reg_class_agnostic else classes
    priors = rois[:, None, 1:].expand(-1, per_class, 4).reshape(-1, 4)
    boxes = _decode(bbox_head.bbox_coder, priors, bbox_pred.reshape(-1, 4),
                    size)
    scores = cls_score.softmax(-1)[:, :-1]
    boxes = boxes.reshape(-1, per_class, 4).expand(-1, classes,
                                                   4).reshape(-1, 4)
    labels = torch.zeros_like(
        scores, dtype=torch.long) + torch.arange(
            classes, device=scores.device)
    scores, labels = scores.reshape(-1), labels.reshape(-1)
    valid = scores > cfg.score_thr
    boxes, scores, labels = boxes[valid], scores[valid], labels[valid]
    keep = _batched_nms(boxes, scores, labels, cfg.nms)
    if cfg.max_per_img > 0:
        keep = keep[:cfg.max_per_img]
    return boxes[keep], scores[keep], labels[keep]


def two_stage_detections(model, x):
    """A two-stage detector's detections, post-processing in the graph.

    :func:`two_stage_forward` continued with the box head's
    ``predict_by_feat`` (decoding, ``score_thr``, class-wise NMS,
    ``max_per_img``; boxes in the input's coordinates) and, with a mask
    head, the mask head on the detections, as ``roi_head.predict`` does:
    the masks are then pasted into the image by the mask head's
    ``predict_by_feat`` outside the graph.

    Args:
        model (nn.Module): an mmdet ``TwoStageDetector`` with a
            ``StandardRoIHead``, in eval mode.
        x (Tensor): the preprocessed images (B, 3, H, W).

    Returns:
        tuple[Tensor]: ``dets`` (K, 5: image index, x1, y1, x2, y2),
        ``scores`` (K, ), ``labels`` (K, ) and with a mask head
        ``mask_preds`` (K, classes, h, w).

    Example:
        >>> model = TensorOutputs(mask_rcnn.eval(), two_stage_detections)
        >>> export_onnx(model, x, 'mask-rcnn.onnx')
    """
    feats = model.extract_feat(x)
    rois = _rois(model, feats, x)
    head = model.roi_head
    cls_score, bbox_pred = _bbox_forward(head, feats, rois)
    size = _image_size(x)
    dets, scores, labels = [], [], []
    for i in range(len(x)):
        mine = rois[:, 0] == i
        boxes, score, label = _detections(head.bbox_head, rois[mine],
                                          cls_score[mine], bbox_pred[mine],
                                          size, head.test_cfg)
        dets.append(torch.cat([torch.full_like(boxes[:, :1], i), boxes], 1))
        scores.append(score)
        labels.append(label)
    dets = torch.cat(dets)
    outs = (dets, torch.cat(scores), torch.cat(labels))
    if head.with_mask:
        outs = outs + (_mask_forward(head, feats, dets), )
    return outs


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
