"""What kind of OpenMMLab model a module is, and its outputs as one flat
tuple of tensors: the one answer that the export (:mod:`.export`,
:mod:`.predict`) and the complexity count (:mod:`mmevo.apis.complexity`)
share.

Example:
    >>> model_kind(retinanet)
    'det'
    >>> flatten_outputs(retinanet(x, mode='tensor'))  # scores, boxes
"""

from torch.utils import _pytree as pytree

#: what each kind of model exports, see :func:`model_kind`
KINDS = ('two-stage', 'det', 'seg', 'tensor', 'module')


def model_kind(model):
    """What ``model`` is, by the heads it has: 'two-stage' (an RPN and a
    RoI head; it exports the detections of
    :func:`mmevo.deploy.mmdet.two_stage_detections`), 'det' (a
    single-stage detector: its head's outputs), 'seg' (an
    encoder-decoder: its logits), 'tensor' (another OpenMMLab model, e.g.
    a classifier: its ``mode='tensor'`` outputs) or 'module' (a backbone
    or any other module: ``model(x)``).

    Example:
        >>> model_kind(retinanet)
        'det'
    """
    if hasattr(model, 'rpn_head') and hasattr(model, 'roi_head'):
        return 'two-stage'
    if hasattr(model, 'bbox_head'):
        return 'det'
    if hasattr(model, 'decode_head'):
        return 'seg'
    if hasattr(model, 'data_preprocessor'):  # mmengine's BaseModel
        return 'tensor'
    return 'module'


def flatten_outputs(outputs):
    """The leaves of nested tuples, lists and dicts of outputs (e.g. the
    per-level lists of ``model(x, mode='tensor')``), in order, as one
    tuple: what exporters and jit tracing take.

    Example:
        >>> flatten_outputs(([s3, s4], [b3, b4]))
        (s3, s4, b3, b4)
    """
    return tuple(pytree.tree_leaves(outputs))
