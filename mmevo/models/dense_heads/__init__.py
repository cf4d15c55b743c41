from .involution_rpn_head import InvolutionRPNHead

__all__ = ['InvolutionRPNHead']
