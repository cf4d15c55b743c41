"""Parameters and FLOPs of a whole detector, segmentor or classifier.

Counts with mmengine's jit-based ``FlopAnalyzer`` (one multiply-add = one
FLOP), with the handles of :mod:`mmevo.ops.flops` registered so the work of
the mmevo ops (and of ACmix's ``baddbmm``) is counted, on what the published
tables measured:

* parameters: mmcv 1.x's counter (used for the published tables) counts only
  parameters with ``requires_grad``, so a detector's frozen stem and stage 1
  (``frozen_stages=1``) are left out. :func:`count_parameters` gives both.
* FLOPs: mmcv 1.x's counter hooked modules (conv, linear, norm, activation,
  pooling, upsampling) and did not see the published CUDA involution, a
  plain function; it did count element-wise ops that mmengine's counter
  ignores (ReLU, pooling). Neither convention is the other exactly.
* forward: the published ``forward_dummy`` of mmdet 2.x / mmseg 0.x: one
  image, a two-stage detector's RoI head on 1000 proposals (the mask head on
  the first 100), a segmentor's decode head without the auxiliary head; a
  classifier's backbone, neck and head (mmcls 0.x: 224x224).

Example:
    >>> flops = count_flops(build_model(cfg), (800, 1280))
    >>> total = sum(flops.values())
"""

from collections import Counter

import torch
from mmengine.analysis import FlopAnalyzer
from mmengine.structures import InstanceData
from torch import nn

from mmevo.deploy.kinds import flatten_outputs, model_kind
from mmevo.ops.flops import FLOP_HANDLES

#: Default input (H, W) per task, those of the tools that made the published
#: tables: mmdet 2.x ``get_flops.py --shape 1280 800`` and mmseg 0.x
#: ``--shape 2048 1024`` built inputs (1, 3, H, W) with H the first number.
#: Every stride divides both sides, so the transposed shape counts the same.
#: ImageNet classifiers: 224x224 (mmcls 0.x's default).
DEFAULT_SHAPES = {'det': (1280, 800), 'seg': (2048, 1024), 'cls': (224, 224)}
#: Proposals the published two-stage ``forward_dummy`` fed its RoI head.
NUM_PROPOSALS = 1000
_TASKS = {'two-stage': 'det', 'det': 'det', 'seg': 'seg'}


class DummyForward(nn.Module):
    """The published ``forward_dummy`` of a detector or segmentor, traceable
    by the FLOP counter: tensor in, tensors out.

    Args:
        model (nn.Module): an mmdet 3.x detector, an mmseg 1.x segmentor or
            an mmpretrain classifier.
        num_proposals (int): fixed proposals for a two-stage RoI head.

    Example:
        >>> outs = DummyForward(build_model(cfg))(torch.randn(1, 3, 800, 1280))
    """

    def __init__(self, model, num_proposals=NUM_PROPOSALS):
        super().__init__()
        self.model = model
        self.num_proposals = num_proposals

    def forward(self, inputs):
        model = self.model
        if model_kind(model) == 'two-stage':
            feats = model.extract_feat(inputs)
            rpn_outs = model.rpn_head(feats)
            # Fixed in-image boxes: the RoI head's cost does not depend on
            # where they are, only on how many.
            h, w = inputs.shape[-2:]
            gen = torch.Generator().manual_seed(0)
            xy = torch.rand(self.num_proposals, 2, generator=gen)
            wh = torch.rand(self.num_proposals, 2, generator=gen) * 0.5
            boxes = torch.cat([xy * 0.5, xy * 0.5 + wh], dim=1)
            boxes = boxes * boxes.new_tensor([w, h, w, h])
            proposals = [InstanceData(bboxes=boxes.to(inputs.device))]
            roi_outs = model.roi_head.forward(feats, proposals)
            return flatten_outputs((rpn_outs, roi_outs))
        # Single-stage detectors, segmentors and classifiers: mode='tensor'
        # is the network without post-processing (no auxiliary head, as
        # published; a classifier's logits).
        return flatten_outputs(model(inputs, mode='tensor'))


def task_of(model):
    """'det', 'seg' or 'cls' (the key of :data:`DEFAULT_SHAPES`), by the
    model's :func:`mmevo.deploy.model_kind`: a detector, an
    encoder-decoder, or else a classifier."""
    return _TASKS.get(model_kind(model), 'cls')


def count_parameters(model):
    """Parameters of ``model``: (all, trainable).

    Args:
        model (nn.Module): the model.

    Returns:
        tuple[int, int]: every parameter; those with ``requires_grad`` (the
        published convention).
    """
    params = list(model.parameters())
    return (
        sum(p.numel() for p in params),
        sum(p.numel() for p in params if p.requires_grad),
    )


def count_flops(model, shape):
    """FLOPs (multiply-adds) of the dummy forward of ``model`` on one image.

    Args:
        model (nn.Module): a detector or segmentor in eval mode.
        shape (tuple[int, int]): the input (H, W).

    Returns:
        Counter: FLOPs by operator name (``conv``, ``linear``,
        ``evolution_aggregate``, ...).

    Example:
        >>> flops = count_flops(model, (800, 1280))
        >>> total = sum(flops.values())
    """
    h, w = shape
    inputs = torch.randn(1, 3, h, w, device=next(model.parameters()).device)
    analyzer = FlopAnalyzer(DummyForward(model), (inputs,))
    analyzer.set_op_handle(**FLOP_HANDLES)
    analyzer.unsupported_ops_warnings(False).uncalled_modules_warnings(False)
    with torch.no_grad():
        return Counter(analyzer.by_operator())
