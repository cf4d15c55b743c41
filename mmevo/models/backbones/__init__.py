from .acmix_resnet import ACmixResNet
from .rednet import RedNet

__all__ = ['ACmixResNet', 'RedNet']
