from .acmix_resnet import ACmixResNet
from .acmix_swin import ACmixSwinTransformer
from .elsa_swin import ELSASwinTransformer
from .rednet import RedNet

__all__ = [
    'ACmixResNet',
    'ACmixSwinTransformer',
    'ELSASwinTransformer',
    'RedNet',
]
