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
import sys
import warnings

# as in tools/train.py: mmengine's pkg_resources import warns on every start
warnings.filterwarnings('ignore', 'pkg_resources is deprecated', UserWarning)

import torch
from mmdet.structures.bbox import scale_boxes
from mmengine.registry import RUNNERS
from mmengine.runner import Runner
from mmengine.structures import InstanceData

import mmevo  # noqa: F401  (registers mmevo's modules in mmengine)
from mmevo.deployment import OnnxModel

# tools/_cli.py and the exporter beside this script
sys.path[:0] = [
    osp.dirname(osp.dirname(osp.abspath(__file__))),
    osp.dirname(osp.abspath(__file__))
]
from _cli import (add_evaluation_args, dump_results, exit_if_data_missing,
                  fail, load_config)
from pytorch2onnx import model_kind


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


def onnx_predict(model, session):
    """``model.predict`` on ``session``'s outputs, image by image (the
    graph has batch 1), post-processed by ``model``'s own head."""
    kind = model_kind(model)

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
    add_evaluation_args(parser)
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    if not osp.isfile(args.model):
        fail(f"ONNX model '{args.model}' does not exist")
    cfg = load_config(args.config)
    if args.cfg_options is not None:
        cfg.merge_from_dict(args.cfg_options)
    cfg.work_dir = args.work_dir or cfg.get('work_dir') or osp.join(
        './work_dirs',
        osp.splitext(osp.basename(args.config))[0] + '_onnx')
    cfg.load_from = None
    if args.out is not None:
        dump_results(cfg, args.out)
    exit_if_data_missing(cfg, ['test_dataloader'])
    runner = (
        Runner.from_cfg(cfg)
        if 'runner_type' not in cfg else RUNNERS.build(cfg))
    model = runner.model
    model.predict = onnx_predict(model, OnnxModel(args.model))
    return runner.test()


if __name__ == '__main__':
    main()
