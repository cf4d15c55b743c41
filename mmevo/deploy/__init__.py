"""Deployment: mmevo's models exported to ONNX (onnxruntime) and to
AOTInductor packages (PyTorch's runtime, from Python or C++).

* :mod:`.export`: :func:`export_onnx` and :class:`TensorOutputs`;
* :mod:`.aoti`: :func:`export_aoti` and :class:`AotiModel`;
* :mod:`.runtime`: :class:`OnnxModel` (onnxruntime);
* :mod:`.detection_ops`: NMS and RoIAlign as ``torch.ops.mmevo`` operators;
* :mod:`.rewrites`: module forwards rewritten for an export (instances
  only, for the export's length); :mod:`.mmseg` holds mmseg's;
* :mod:`.mmdet`: two-stage detectors as one graph (imports mmdet, so
  not imported here: exporting a layer or a backbone needs no mmdet);
* :mod:`.kinds`: :func:`model_kind` and :func:`flatten_outputs`, what
  kind of model a module is and its outputs as one tuple;
* :mod:`.predict` and :mod:`.parity`: the evaluation and the checks of
  ``tools/deployment``.

Example:
    >>> from mmevo.deploy import OnnxModel, exportable, export_onnx
    >>> model, kind = exportable(detector.eval())
    >>> export_onnx(model, torch.randn(1, 3, 128, 128), 'det.onnx')
    >>> outputs = OnnxModel('det.onnx')(torch.randn(1, 3, 96, 160))
"""

from .aoti import AotiModel, export_aoti
from .detection_ops import nms, roi_align
from .export import TensorOutputs, export_onnx
from .kinds import flatten_outputs, model_kind
from .parity import check_outputs, match_rows, max_difference
from .predict import expected_outputs, exportable, runtime_predict
from .rewrites import adaptive_avg_pool2d, ceil_avg_pool2d, export_rewrites
from .runtime import OnnxModel

__all__ = [
    'AotiModel',
    'OnnxModel',
    'TensorOutputs',
    'adaptive_avg_pool2d',
    'ceil_avg_pool2d',
    'check_outputs',
    'expected_outputs',
    'export_aoti',
    'export_onnx',
    'export_rewrites',
    'exportable',
    'flatten_outputs',
    'match_rows',
    'max_difference',
    'model_kind',
    'nms',
    'roi_align',
    'runtime_predict',
]
