"""The Triton attention weights keep their logits in fp32 before the softmax.

Rounded to bf16 first, a logit of 8 is off by up to 0.03, and so is its
weight, relatively. Run in a subprocess under ``TRITON_INTERPRET=1`` on CPU
(Triton reads it when imported), compiled on CUDA when there is one.
"""

import os
import subprocess
import sys

import pytest
import torch

pytestmark = pytest.mark.slow

REPO = os.path.dirname(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
)
SCRIPT = """
import torch
from mmevo.ops import local_attention_weights
from mmevo.ops.library import use_backend
from mmevo.ops.checks import Window
from mmevo.ops.reference import attention_weights_reference
device = 'cuda' if torch.cuda.is_available() else 'cpu'
gen = torch.Generator().manual_seed(0)
# 64 channels per head, unscaled: logits of std 8.
q, k = (torch.randn(1, 64, 6, 5, generator=gen).bfloat16().to(device)
        for _ in range(2))
with use_backend('triton'):
    got = local_attention_weights(q, k, 1, 3)
window = Window(3, 1, 1, 1, 'zeros')
ref = attention_weights_reference(q.double(), k.double(), 1, window)
print(float((got.double() - ref).abs().max()))
"""


@pytest.mark.cuda
def test_attention_weights_bf16_logits_fp32():
    env = dict(os.environ, PYTHONPATH=REPO)
    if not torch.cuda.is_available():
        env['TRITON_INTERPRET'] = '1'
    out = subprocess.run(
        [sys.executable, '-c', SCRIPT],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    # Weights are <= 1: one bf16 rounding of the result, 2**-8 at most.
    assert float(out.stdout.split()[-1]) <= 2**-8
