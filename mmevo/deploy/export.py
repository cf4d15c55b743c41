"""ONNX export with plain ``torch.onnx.export``: the driver.

The evolution ops need no special argument to export (while
``torch.onnx.export`` runs they are standard ONNX operators, see
:mod:`mmevo.ops.decompositions`); :func:`export_onnx` only chooses the dynamic
axes, registers what the exporters need for the NMS and RoIAlign of
:mod:`mmevo.deploy.detection_ops`, and runs the model under
:func:`export_rewrites`. :class:`TensorOutputs` flattens the nested
outputs of OpenMMLab models, e.g. the per-level lists of
``model(x, mode='tensor')``, into a tuple of tensors.
"""

import contextlib

import torch
from torch import nn

from mmevo.layers.base import EvolutionLayer

from .detection_ops import (
    ONNX_TRANSLATIONS,
    OPSET_VERSION,
    register_onnx_symbolics,
)
from .kinds import flatten_outputs, model_kind
from .rewrites import export_rewrites


class TensorOutputs(nn.Module):
    """A model's raw tensor outputs, flattened into one tuple.

    Args:
        model (nn.Module): an OpenMMLab model (called with ``mode='tensor'``)
            or any module when ``forward`` is given.
        forward (callable, optional): ``forward(model, x)`` instead of
            ``model(x, mode='tensor')``. Default: that call, or
            :func:`mmevo.deploy.mmdet.two_stage_forward` for a two-stage
            model (:func:`mmevo.deploy.model_kind`).

    Example:
        >>> model = TensorOutputs(detector.eval())   # mode='tensor'
        >>> outputs = model(torch.randn(1, 3, 128, 128))   # a tuple
    """

    def __init__(self, model, forward=None):
        super().__init__()
        self.model = model
        if forward is None and model_kind(model) == 'two-stage':
            from .mmdet import two_stage_forward

            forward = two_stage_forward
        self._forward = forward
        # the model's mode: exporters restore the wrapper's mode afterwards
        self.train(model.training)

    def forward(self, x):
        if self._forward is not None:
            out = self._forward(self.model, x)
        else:
            out = self.model(x, mode='tensor')
        return flatten_outputs(out)


@contextlib.contextmanager
def naming_failing_layer(model, what):
    """Inside the block, an exception raised while an evolution layer of
    ``model`` runs becomes a ``RuntimeError`` naming the layer and its
    settings: ``f'{what} failed in layer ...'``."""
    names = {
        m: name
        for name, m in model.named_modules()
        if isinstance(m, EvolutionLayer)
    }
    running = []
    handles = [
        m.register_forward_pre_hook(lambda m, _: running.append(m))
        for m in names
    ] + [
        m.register_forward_hook(lambda m, _, __: running.remove(m))
        for m in names
    ]
    try:
        yield
    except Exception as e:
        if not running:
            raise
        layer = running[-1]
        raise RuntimeError(
            f'{what} failed in layer {names[layer]!r} '
            f'({type(layer).__name__}: kernel_size={layer.kernel_size}, '
            f'stride={layer.stride}, dilation={layer.dilation}, '
            f'padding_mode={layer.padding_mode!r}): {e}'
        ) from e
    finally:
        for h in handles:
            h.remove()


def export_onnx(
    model, x, path, dynamic=True, dynamo=True, opset_version=OPSET_VERSION
):
    """``torch.onnx.export(model, (x, ), path)`` with H and W dynamic.

    Args:
        model (nn.Module): in eval mode; returns a tensor or a tuple of them.
        x (Tensor): the example input (B, C, H, W); B stays fixed.
        path (str): the ``.onnx`` file to write, the weights in it (so a
            model over ONNX's 2 GB file limit cannot be exported).
        dynamic (bool): H and W of the input (and of every 4-d output)
            dynamic, so one export serves every size. Default: True.
        dynamo (bool): the dynamo exporter (torch's default; given
            :data:`mmevo.deploy.detection_ops.ONNX_TRANSLATIONS`) or the
            TorchScript one (given
            :func:`mmevo.deploy.detection_ops.register_onnx_symbolics`).
            Default: True.
        opset_version (int): Default: 18.

    Raises:
        RuntimeError: naming the evolution layer (and its settings) that
            was running when the export failed.

    Example:
        >>> model = TensorOutputs(detector.eval())
        >>> export_onnx(model, torch.randn(1, 3, 128, 128), 'det.onnx')
        >>> outputs = OnnxModel('det.onnx')(torch.randn(1, 3, 96, 160))
    """
    with naming_failing_layer(model, 'ONNX export'):
        kwargs = {}
        if dynamo:
            kwargs['custom_translation_table'] = ONNX_TRANSLATIONS
            # one file with its weights (not beside it in path.data), which
            # a writer can write atomically and a user copy alone
            kwargs['external_data'] = False
            if dynamic:
                dim = torch.export.Dim.DYNAMIC
                kwargs['dynamic_shapes'] = ({2: dim, 3: dim},)
        else:
            register_onnx_symbolics()
            if dynamic:
                kwargs.update(_dynamic_axes(model, x))
        with torch.no_grad(), export_rewrites(model):
            torch.onnx.export(
                model,
                (x,),
                path,
                dynamo=dynamo,
                opset_version=opset_version,
                **kwargs,
            )


def _dynamic_axes(model, x):
    """TorchScript exporter arguments: H and W of the input and of every 4-d
    output dynamic."""
    with torch.no_grad():
        outs = model(x)
    outs = outs if isinstance(outs, (tuple, list)) else (outs,)
    outputs = [f'output{i}' for i in range(len(outs))]
    return dict(
        input_names=['input'],
        output_names=outputs,
        dynamic_axes={
            name: {2: f'{name}_height', 3: f'{name}_width'}
            for name, t in zip(['input', *outputs], [x, *outs], strict=True)
            if t.dim() == 4
        },
    )
