"""Two-stage detectors (Faster / Mask R-CNN) as one graph for
``torch.onnx.export`` and ``torch.export``: mmdet's inference rewritten
without branches on data, its NMS and RoIAlign those of
:mod:`mmevo.deploy.detection_ops`.

:func:`two_stage_forward` is ``model(x, mode='tensor')``,
:func:`two_stage_detections` goes on through the box head's
post-processing. :class:`mmevo.deploy.TensorOutputs` takes the first by
default for a two-stage model (:func:`mmevo.deploy.model_kind`).
"""

import torch
from mmdet.models.task_modules.coders.delta_xywh_bbox_coder import delta2bbox
from torch.utils import _pytree as pytree

from .detection_ops import nms, roi_align


def _roi_align(layer, feats, rois):
    if layer.pool_mode != 'avg':
        raise ValueError(
            f"RoIAlign pool_mode must be 'avg' to export (ONNX "
            f"RoiAlign's max differs), got {layer.pool_mode!r}"
        )
    return roi_align(
        feats,
        rois,
        list(layer.output_size),
        float(layer.spatial_scale),
        int(layer.sampling_ratio),
        bool(layer.aligned),
    )


def _roi_features(extractor, feats, rois):
    """``SingleRoIExtractor(feats, rois)`` without its data-dependent
    branches: every RoI through every level's RoIAlign, masked to its own
    level (as exact: the other levels add zeros)."""
    feats = feats[: extractor.num_inputs]
    if len(feats) == 1:
        return _roi_align(extractor.roi_layers[0], feats[0], rois)
    levels = extractor.map_roi_levels(rois, len(feats))
    out = 0
    for i, layer in enumerate(extractor.roi_layers[: len(feats)]):
        mask = (levels == i).to(rois.dtype).view(-1, 1, 1, 1)
        out = out + _roi_align(layer, feats[i], rois) * mask
    return out


def _image_size(x):
    """(H, W) of the images ``x`` as a tensor of the graph under both
    exporters: the last entries of aranges (whose lengths TorchScript
    traces as sizes, torch.export as symbols)."""
    return torch.cat(
        [torch.arange(1, n + 1, device=x.device)[-1:] for n in x.shape[2:]]
    )


def _padded(t, n):
    """``t`` with ``n`` rows of zeros appended."""
    return torch.cat([t, t.new_zeros(n, *t.shape[1:])])


def _extra_row(fn, *tensors):
    """``fn(*tensors)`` with a row of zeros appended to each tensor, and
    dropped from each output.

    The rows are as many as NMS keeps, which torch.export cannot tell from
    0; mmdet's ``delta2bbox`` and the batch norms of the heads branch on
    that, one more row makes their count at least 1. ``fn`` treats each row
    on its own, so the result is exact (and no head runs on no rows).
    """
    outs = fn(*[_padded(t, 1) for t in tensors])
    return pytree.tree_map(lambda t: t[:-1], outs)


def _decode(coder, priors, deltas, size):
    """``coder.decode(priors, deltas, max_shape=size)`` with the size a
    tensor of the graph (H and W stay dynamic)."""
    if type(coder).__name__ != 'DeltaXYWHBBoxCoder':
        raise ValueError(
            f'the box coder must be DeltaXYWHBBoxCoder to '
            f'export, got {type(coder).__name__}'
        )
    boxes = _extra_row(
        lambda priors, deltas: delta2bbox(
            priors,
            deltas,
            coder.means,
            coder.stds,
            add_ctr_clamp=coder.add_ctr_clamp,
            ctr_clamp=coder.ctr_clamp,
        ),
        priors,
        deltas,
    )
    if coder.clip_border:
        limit = size.flip(0).repeat(2).to(boxes)
        boxes = torch.min(boxes.clamp(min=0), limit)
    return boxes


def _batched_nms(boxes, scores, ids, nms_cfg):
    """mmcv's ``batched_nms`` indices: one NMS on the boxes offset by id
    (what mmcv does below ``split_thr`` boxes, the same result above)."""
    if nms_cfg.get('type', 'nms') != 'nms' or nms_cfg.get('offset', 0):
        raise ValueError(
            f'the NMS must be plain nms (offset 0) to export, '
            f'got {dict(nms_cfg)}'
        )
    offset = 0
    if not nms_cfg.get('class_agnostic'):
        # a zero added: no error on no boxes (clipped boxes are >= 0)
        top = torch.cat([boxes.reshape(-1), boxes.new_zeros(1)]).max()
        offset = ids[:, None].to(boxes) * (top + 1)
    return nms(boxes + offset, scores, float(nms_cfg['iou_threshold']))


def _top(score, k):
    """The ``k`` best of ``score`` (N, ), their indices and a mask of those
    that are real: mmdet's ``score.sort()[:k]`` when N > k, all N otherwise.

    The scores get ``k`` padding entries below every real one (scores are
    probabilities, >= 0), so the top ``k`` are ``k`` rows at every N: a
    slice of the N real ones would have min(N, k) rows, which torch.export
    settles at the example (a guard on N, or a bound a package overruns at
    sizes much larger than the example). The padding rows, last in the
    order, are dropped with the mask.
    """
    n = score.shape[0]
    score, order = torch.cat([score, score.new_full((k,), -1)]).sort(
        descending=True
    )
    return score[:k], order[:k], order[:k] < n


def _proposals(rpn_head, scores, deltas, size):
    """``RPNHead.predict_by_feat`` for one image, the branches on data
    (level sizes against ``nms_pre``, empty results) taken the same way for
    every input: top-k by a sort and a slice of ``nms_pre`` rows at every
    size (:func:`_top`), the padding and small boxes dropped by a mask,
    the levels' NMS as one NMS on boxes offset by level."""
    cfg = rpn_head.test_cfg
    coder = rpn_head.bbox_coder
    nms_cfg = cfg.nms
    priors = rpn_head.prior_generator.grid_priors(
        [s.shape[-2:] for s in scores], scores[0].dtype, scores[0].device
    )
    nms_pre = cfg.get('nms_pre', -1)
    level_scores, level_boxes, level_priors, level_ids = [], [], [], []
    level_real = []
    for level, (score, delta, prior) in enumerate(
        zip(scores, deltas, priors, strict=True)
    ):
        score = score.permute(1, 2, 0).reshape(-1, rpn_head.cls_out_channels)
        score = (
            score.sigmoid()
            if rpn_head.use_sigmoid_cls
            else score.softmax(-1)[:, :-1]
        )
        score = score.reshape(-1)
        delta = delta.permute(1, 2, 0).reshape(-1, 4)
        real = None
        if nms_pre > 0:
            score, order, real = _top(score, nms_pre)
            delta, prior = (
                _padded(delta, nms_pre)[order],
                _padded(prior, nms_pre)[order],
            )
        level_scores.append(score)
        level_boxes.append(delta)
        level_priors.append(prior)
        level_ids.append(torch.full_like(score, level))
        level_real.append(real)
    score = torch.cat(level_scores)
    boxes = _decode(
        coder, torch.cat(level_priors), torch.cat(level_boxes), size
    )
    ids = torch.cat(level_ids)
    valid = torch.cat(level_real) if nms_pre > 0 else None
    if cfg.get('min_bbox_size', -1) >= 0:
        wh = boxes[:, 2:] - boxes[:, :2]
        big = (wh > cfg.min_bbox_size).all(1)
        valid = big if valid is None else valid & big
    if valid is not None:
        boxes, score, ids = boxes[valid], score[valid], ids[valid]
        # The mask's count is bounded by the candidates: without that bound
        # (the anchors of an unbounded H x W, ~1e37) AOTInductor's C++
        # overflows int64 when it writes the count's range. TorchScript's
        # tracer has a tensor for the count, and nothing to bound.
        if not torch.jit.is_tracing():
            most = nms_pre * len(scores) if nms_pre > 0 else 2**31 - 1
            torch._check(boxes.shape[0] <= most)
    keep = _batched_nms(boxes, score, ids, nms_cfg)
    return boxes[keep][: cfg.max_per_img]


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
        outs = (*outs, _mask_forward(head, feats, rois[:100]))
    return outs


def _rois(model, feats, x):
    scores, deltas = model.rpn_head(feats)
    size = _image_size(x)
    rois = []
    for i in range(len(x)):
        boxes = _proposals(
            model.rpn_head,
            [s[i] for s in scores],
            [d[i] for d in deltas],
            size,
        )
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
    return _head_forward(
        head, head.bbox_roi_extractor, head.bbox_head, feats, rois
    )


def _mask_forward(head, feats, rois):
    extractor = (
        head.bbox_roi_extractor
        if head.share_roi_extractor
        else head.mask_roi_extractor
    )
    return _head_forward(head, extractor, head.mask_head, feats, rois)


def _detections(bbox_head, rois, cls_score, bbox_pred, size, cfg):
    """``bbox_head.predict_by_feat`` of one image (no rescaling):
    decoding, the score threshold and the class-wise NMS."""
    if bbox_head.custom_cls_channels:
        raise ValueError(
            'a box head with custom class channels does not export'
        )
    classes = bbox_head.num_classes
    per_class = 1 if bbox_head.reg_class_agnostic else classes
    priors = rois[:, None, 1:].expand(-1, per_class, 4).reshape(-1, 4)
    boxes = _decode(
        bbox_head.bbox_coder, priors, bbox_pred.reshape(-1, 4), size
    )
    scores = cls_score.softmax(-1)[:, :-1]
    boxes = (
        boxes.reshape(-1, per_class, 4).expand(-1, classes, 4).reshape(-1, 4)
    )
    labels = torch.zeros_like(scores, dtype=torch.long) + torch.arange(
        classes, device=scores.device
    )
    scores, labels = scores.reshape(-1), labels.reshape(-1)
    valid = scores > cfg.score_thr
    boxes, scores, labels = boxes[valid], scores[valid], labels[valid]
    keep = _batched_nms(boxes, scores, labels, cfg.nms)
    if cfg.max_per_img > 0:
        keep = keep[: cfg.max_per_img]
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
        boxes, score, label = _detections(
            head.bbox_head,
            rois[mine],
            cls_score[mine],
            bbox_pred[mine],
            size,
            head.test_cfg,
        )
        dets.append(torch.cat([torch.full_like(boxes[:, :1], i), boxes], 1))
        scores.append(score)
        labels.append(label)
    dets = torch.cat(dets)
    outs = (dets, torch.cat(scores), torch.cat(labels))
    if head.with_mask:
        outs = (*outs, _mask_forward(head, feats, dets))
    return outs
