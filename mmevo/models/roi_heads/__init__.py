from .involution_mask_head import InvolutionFCNMaskHead

__all__ = ['InvolutionFCNMaskHead']
