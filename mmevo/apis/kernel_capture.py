"""The kernels an evolution layer generates, captured on a model's input.

Example:
    >>> layers = evolution_layers(model)
    >>> inputs = preprocess(model, mmcv.imread('demo.jpg'))
    >>> kernel = capture_kernel(model, layers['backbone.layer2.0.conv2'],
    ...                         inputs)  # (G, K, K, H_out, W_out)
"""

import numpy as np
import torch

from mmevo.layers import EvolutionLayer


def evolution_layers(model):
    """``{name: layer}`` of every evolution layer in ``model``."""
    return {
        name: m
        for name, m in model.named_modules()
        if isinstance(m, EvolutionLayer)
    }


def preprocess(model, image):
    """Image (H, W, 3) BGR uint8 -> the model's normalised, padded batch."""
    tensor = torch.from_numpy(np.ascontiguousarray(image.transpose(2, 0, 1)))
    data = dict(inputs=[tensor], data_samples=None)
    return model.data_preprocessor(data, False)['inputs']


def extract_features(model, inputs):
    """Run the feature extractor (backbone + neck), or the whole model."""
    if hasattr(model, 'extract_feat'):
        return model.extract_feat(inputs)
    if hasattr(model, 'backbone'):
        return model.backbone(inputs)
    return model(inputs, mode='tensor')


def capture_kernel(model, layer, inputs):
    """The kernel (G, K, K, H_out, W_out) ``layer`` generates for the first
    image of ``inputs``.

    Raises:
        ValueError: ``layer`` is not on the feature extractor's path.
    """
    kernels = []
    handle = layer.register_kernel_hook(
        lambda module, kernel: kernels.append(kernel.detach())
    )
    try:
        with torch.no_grad():
            extract_features(model, inputs)
    finally:
        handle.remove()
    if not kernels:
        raise ValueError(
            'the layer generated no kernel: it is not on the '
            'path of the feature extractor'
        )
    return kernels[0][0].float().cpu()
