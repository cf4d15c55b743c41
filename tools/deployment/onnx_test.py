"""Evaluate an ONNX detector or segmentor with onnxruntime on the config's
test set, scored by the config's own metric (``test_evaluator``).

The ONNX model (from ``tools/deployment/pytorch2onnx.py``) gives the raw
head outputs; the model built from the config turns them into predictions
with its own head's ``predict_by_feat`` (boxes, NMS, rescaling / logits
resized; a two-stage detector's graph ends in the detections, which its
mask head pastes into the image), exactly as ``tools/test.py`` does with the
PyTorch model.

Example:
    python tools/deployment/onnx_test.py CONFIG work_dirs/demo/model.onnx
"""
import argparse
import os.path as osp
import warnings

# as in tools/train.py: mmengine's pkg_resources import warns on every start
warnings.filterwarnings('ignore', 'pkg_resources is deprecated', UserWarning)

import torch  # noqa: E402
from mmdet.structures.bbox import scale_boxes  # noqa: E402
from mmengine.structures import InstanceData  # noqa: E402

import mmevo  # noqa: E402,F401  (registers mmevo's modules in mmengine)
from mmevo import apis  # noqa: E402
from mmevo.deployment import OnnxModel  # noqa: E402


def two_stage_results(model, outs, metas, rescale):
    """``roi_head.predict``'s results from the graph's detections
    (:func:`mmevo.deployment.two_stage_detections`, one image a run):
    boxes rescaled, masks pasted by the config's own mask head."""
    results = []
    for out, meta in zip(outs, metas):
        res = InstanceData(bboxes=out[0][:, 1:], scores=out[1], labels=out[2])
        if rescale and not model.roi_head.with_mask:
            res.bboxes = scale_boxes(res.bboxes,
                                     [1 / s for s in meta['scale_factor']])
        results.append(res)
    if model.roi_head.with_mask:
        # rescales the boxes too, as in roi_head.predict
        results = model.roi_head.mask_head.predict_by_feat(
            mask_preds=tuple(out[3] for out in outs),
            results_list=results,
            batch_img_metas=metas,
            rcnn_test_cfg=model.roi_head.test_cfg,
            rescale=rescale)
    return results


def expected_outputs(model, kind):
    """The output counts an export of ``model`` can have."""
    if kind == 'seg':
        return [1]
    if kind == 'two-stage':  # boxes, scores, labels[, masks]
        return [4 if model.roi_head.with_mask else 3]
    levels = len(model.bbox_head.prior_generator.strides)
    return [2 * levels, 3 * levels]  # scores, boxes[, centerness] per level


def onnx_predict(model, session, kind):
    """``model.predict`` on ``session``'s outputs, image by image (the
    graph has batch 1), post-processed by ``model``'s own head."""

    def predict(inputs, data_samples, rescale=True):
        outs = [session(inputs[i:i + 1]) for i in range(len(inputs))]
        metas = [s.metainfo for s in data_samples]
        if kind == 'two-stage':
            return model.add_pred_to_datasample(
                data_samples, two_stage_results(model, outs, metas, rescale))
        outs = [torch.cat(level) for level in zip(*outs)]
        if kind == 'seg':
            logits = model.decode_head.predict_by_feat(outs[0], metas)
            return model.postprocess_result(logits, data_samples)
        # (scores per level, boxes per level[, ...]) of the head's forward
        levels = len(model.bbox_head.prior_generator.strides)
        groups = [outs[i:i + levels] for i in range(0, len(outs), levels)]
        results = model.bbox_head.predict_by_feat(
            *groups, batch_img_metas=metas, rescale=rescale)
        return model.add_pred_to_datasample(data_samples, results)

    return predict


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description='Evaluate an ONNX model with onnxruntime')
    parser.add_argument('config', help='config file')
    parser.add_argument('model', help='the .onnx file')
    apis.add_evaluation_args(parser)
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    if not osp.isfile(args.model):
        apis.fail(f"ONNX model '{args.model}' does not exist")
    with apis.one_line_errors():
        cfg = apis.load_config(
            args.config, args.cfg_options, args.work_dir,
            work_dir_suffix='_onnx')
        cfg.load_from = None
        if args.out is not None:
            apis.dump_results(cfg, args.out)
        apis.check_data(cfg, ['test_dataloader'])
        runner = apis.build_runner(cfg)
    model = runner.model
    kind = apis.model_kind(model)
    if kind is None:
        apis.fail('only detectors and encoder-decoder segmentors can be '
                  f'evaluated, got {type(model).__name__}')
    try:
        session = OnnxModel(args.model)
    except Exception as e:  # noqa: BLE001  (onnxruntime's own errors)
        apis.fail(f"ONNX model '{args.model}' cannot be loaded: "
                  f'{str(e).splitlines()[0] if str(e) else type(e).__name__}')
    outputs = len(session.session.get_outputs())
    expected = expected_outputs(model, kind)
    if outputs not in expected:
        apis.fail(f"ONNX model '{args.model}' has {outputs} outputs, the "
                  f"config's {kind} model gives "
                  f"{' or '.join(map(str, expected))}: export this config "
                  'with tools/deployment/pytorch2onnx.py')
    model.predict = onnx_predict(model, session, kind)
    return runner.test()


if __name__ == '__main__':
    main()
