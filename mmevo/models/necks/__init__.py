from .involution_fpn import InvolutionFPN

__all__ = ['InvolutionFPN']
