"""The C++ CPU kernels (``mmevo._ext``) behind the window primitives.

The kernels take contiguous NCHW tensors and zero padding; every dtype of
fp64 / fp32 / bf16 / fp16 is computed natively (bf16 and fp16 accumulate in
fp32). ``available()`` is False when the extension was not built.

The extension runs the widest vector code the CPU has (AVX-512, AVX2 or a
baseline; ``mmevo._ext.isa()`` says which). ``MMEVO_CPU_ISA=avx2`` or
``base``, set before the import, selects a narrower one: the tests use it to
run every variant on one machine.
"""
try:
    from mmevo import _ext
except ImportError:  # not built: the library uses torch_backend instead
    _ext = None


def available():
    """Whether the compiled extension could be imported."""
    return _ext is not None


def aggregate(x, w, stride, padding, dilation):
    """Y = A(x, w), see :func:`mmevo.ops.torch_backend.aggregate`."""
    return _ext.aggregate_forward(x.contiguous(), w.contiguous(), stride,
                                  padding, dilation)


def aggregate_transpose(gy, w, in_hw, stride, padding, dilation):
    """grad_x = At(gy, w), see
    :func:`mmevo.ops.torch_backend.aggregate_transpose`."""
    return _ext.aggregate_transpose(gy.contiguous(), w.contiguous(), in_hw[0],
                                    in_hw[1], stride, padding, dilation)


def correlate(q,
              x,
              groups,
              kernel_size,
              stride,
              padding,
              dilation,
              softmax=False):
    """out = Corr(q, x), see :func:`mmevo.ops.torch_backend.correlate`; the
    softmax is fused: it runs on each tile's sums before they are
    written."""
    return _ext.correlate(q.contiguous(), x.contiguous(), groups, kernel_size,
                          stride, padding, dilation, softmax)
