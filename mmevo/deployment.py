"""ONNX deployment helpers: export with plain ``torch.onnx.export``, run in
onnxruntime.

The evolution ops need no special argument to export (while
``torch.onnx.export`` runs they are standard ONNX operators, see
:mod:`mmevo.ops.export`); these helpers only choose the dynamic axes and
flatten the nested outputs of OpenMMLab models, e.g. the per-level lists of
``model(x, mode='tensor')``, into a tuple of tensors.

Example:
    >>> model = TensorOutputs(detector.eval())   # mode='tensor', flattened
    >>> export_onnx(model, torch.randn(1, 3, 128, 128), 'det.onnx')
    >>> outputs = OnnxModel('det.onnx')(torch.randn(1, 3, 96, 160))
"""
import torch
from torch import nn
from torch.utils import _pytree as pytree

from mmevo.layers.base import EvolutionLayer

OPSET_VERSION = 18


class TensorOutputs(nn.Module):
    """A model's raw tensor outputs, flattened into one tuple.

    Args:
        model (nn.Module): an OpenMMLab model (called with ``mode='tensor'``)
            or any module when ``forward`` is given.
        forward (callable, optional): ``forward(model, x)`` instead of
            ``model(x, mode='tensor')``.
    """

    def __init__(self, model, forward=None):
        super().__init__()
        self.model = model
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
        dynamo (bool): the dynamo exporter (torch's default) or the
            TorchScript one. Default: True.
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
        with torch.no_grad():
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
