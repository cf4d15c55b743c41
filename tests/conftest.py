"""Session-wide test setup.

Without CUDA the Triton kernels run in Triton's interpreter on CPU tensors.
Triton decides that when a function is decorated, and torch >= 2.14 imports
triton while importing ``torch._dynamo`` (which mmengine and mmevo's ops
pull in), so ``TRITON_INTERPRET=1`` is set here, before any test module is
collected.
"""
import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault('TRITON_INTERPRET', '1')
