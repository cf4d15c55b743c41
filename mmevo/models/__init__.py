"""Backbones, necks and heads built on the evolution layers."""

from .backbones import (
    ACmixResNet,
    ACmixSwinTransformer,
    ELSASwinTransformer,
    RedNet,
)
from .dense_heads import InvolutionRPNHead
from .necks import InvolutionFPN
from .roi_heads import InvolutionFCNMaskHead

__all__ = [
    'ACmixResNet',
    'ACmixSwinTransformer',
    'ELSASwinTransformer',
    'InvolutionFCNMaskHead',
    'InvolutionFPN',
    'InvolutionRPNHead',
    'RedNet',
]
