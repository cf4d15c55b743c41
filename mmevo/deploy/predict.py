"""OpenMMLab models around an exported graph: which graph a model exports
(:func:`exportable`, by its :func:`mmevo.deploy.model_kind`) and its
``predict`` with the graph's outputs post-processed by the model's own
heads (:func:`runtime_predict`), as ``tools/deployment/onnx_test.py`` and
``aoti_test.py`` evaluate them."""

import torch

from .export import TensorOutputs
from .kinds import model_kind


def exportable(model):
    """``(TensorOutputs(model, ...), kind)``: the graph to export for
    ``model`` (in eval mode) by its :func:`model_kind`.

    Example:
        >>> wrapped, kind = exportable(mask_rcnn.eval())  # 'two-stage'
        >>> export_onnx(wrapped, x, 'mask-rcnn.onnx')
    """
    kind = model_kind(model)
    forward = None
    if kind == 'two-stage':
        from .mmdet import two_stage_detections

        forward = two_stage_detections
    elif kind == 'module':
        forward = _call
    return TensorOutputs(model, forward), kind


def expected_outputs(model, kind):
    """The output counts the export of ``model`` (a detector or segmentor
    of :func:`model_kind` ``kind``) can have.

    Example:
        >>> expected_outputs(retinanet, 'det')  # 5 levels
        [10, 15]
    """
    if kind == 'seg':
        return [1]
    if kind == 'two-stage':  # boxes, scores, labels[, masks]
        return [4 if model.roi_head.with_mask else 3]
    levels = len(model.bbox_head.prior_generator.strides)
    return [2 * levels, 3 * levels]  # scores, boxes[, centerness] per level


def _call(model, x):
    return model(x)


def _two_stage_results(model, outs, metas, rescale):
    """``roi_head.predict``'s results from the graph's detections
    (:func:`mmevo.deploy.mmdet.two_stage_detections`, one image a run):
    boxes rescaled, masks pasted by the config's own mask head."""
    from mmdet.structures.bbox import scale_boxes
    from mmengine.structures import InstanceData

    results = []
    for out, meta in zip(outs, metas, strict=True):
        res = InstanceData(bboxes=out[0][:, 1:], scores=out[1], labels=out[2])
        if rescale and not model.roi_head.with_mask:
            res.bboxes = scale_boxes(
                res.bboxes, [1 / s for s in meta['scale_factor']]
            )
        results.append(res)
    if model.roi_head.with_mask:
        # rescales the boxes too, as in roi_head.predict
        results = model.roi_head.mask_head.predict_by_feat(
            mask_preds=tuple(out[3] for out in outs),
            results_list=results,
            batch_img_metas=metas,
            rcnn_test_cfg=model.roi_head.test_cfg,
            rescale=rescale,
        )
    return results


def runtime_predict(model, runtime):
    """``model.predict`` on the outputs of ``runtime`` (the exported
    graph of :func:`exportable`, called on a tensor), image by image (the
    graph has batch 1), post-processed by ``model``'s own head.

    Args:
        model (nn.Module): the detector or segmentor the graph came from.
        runtime (callable): e.g. an :class:`mmevo.deploy.OnnxModel` or an
            :class:`mmevo.deploy.AotiModel`.

    Returns:
        callable: ``predict(inputs, data_samples, rescale=True)``.

    Raises:
        ValueError: ``model`` is no detector or segmentor.

    Example:
        >>> runner.model.predict = runtime_predict(runner.model, session)
        >>> runner.test()
    """
    kind = model_kind(model)
    if kind not in ('two-stage', 'det', 'seg'):
        raise ValueError(
            f'only detectors and encoder-decoder segmentors '
            f'can be evaluated, got {type(model).__name__}'
        )

    def predict(inputs, data_samples, rescale=True):
        outs = [runtime(inputs[i : i + 1]) for i in range(len(inputs))]
        metas = [s.metainfo for s in data_samples]
        if kind == 'two-stage':
            return model.add_pred_to_datasample(
                data_samples, _two_stage_results(model, outs, metas, rescale)
            )
        outs = [torch.cat(level) for level in zip(*outs, strict=True)]
        if kind == 'seg':
            logits = model.decode_head.predict_by_feat(outs[0], metas)
            return model.postprocess_result(logits, data_samples)
        # (scores per level, boxes per level[, ...]) of the head's forward
        levels = len(model.bbox_head.prior_generator.strides)
        groups = [outs[i : i + levels] for i in range(0, len(outs), levels)]
        results = model.bbox_head.predict_by_feat(
            *groups, batch_img_metas=metas, rescale=rescale
        )
        return model.add_pred_to_datasample(data_samples, results)

    return predict
