"""The switch of the CPU fast paths, and the 1x1 convolution they share.

Layers and backbones are written as the published (stock) graph, every
convolution called as a module, so forward hooks, ``print(model)``, FLOP
counters, ``torch.compile`` and exporters see it. On CPU, oneDNN runs some
of those modules 1.5-10x slower than an equivalent formulation
(``docs/benchmarks.md``). A class with such a rewrite holds it as a method,
next to its stock forward, and takes it only when
:func:`takes_cpu_fastpath` holds, in the spirit of timm's ``fused_attn``:

* the module's ``use_cpu_fastpath`` attribute is True; it defaults, when the
  module is built, from the environment variable ``MMEVO_CPU_FASTPATH``
  ('1', the default, or '0'), and :func:`set_cpu_fastpath` sets it for a
  whole model;
* the input is a CPU tensor (any other device, ``meta`` included, runs the
  stock graph);
* nothing is tracing, scripting, exporting or compiling: the rewrites were
  measured in eager mode only, and tools that look at the graph must see the
  stock one;
* no forward or backward hook is registered on the module or on any of its
  submodules, and no global module hook (``register_module_forward_hook``
  and the like): a rewrite skips some module calls, and a hook must fire
  exactly as it does on the stock graph (Grad-CAM, feature extractors,
  counters). Stepping aside costs one walk over the submodules per call,
  which is cheaper than keeping the module calls in every rewrite
  (``docs/benchmarks.md``). A rewrite runs its body in
  :func:`cpu_fastpath_scope`, so that its submodules' own tests skip the walk
  and the capture test it has just made.

A layer whose fast path is a fused C++ op (the involution, local
attention) takes it only when :func:`takes_fused_cpu` also holds.
"""

import functools
import os
import threading

import torch
import torch.nn.functional as F
from torch import nn

from mmevo.ops import cpp_backend
from mmevo.ops.backends import backend_name

ENV_VAR = 'MMEVO_CPU_FASTPATH'


def cpu_fastpath_default() -> bool:
    """The default of ``use_cpu_fastpath``, from ``MMEVO_CPU_FASTPATH``.

    Returns:
        bool: False when the variable is '0', True when it is '1' or unset.
    """
    value = os.environ.get(ENV_VAR, '1')
    if value not in ('0', '1'):
        raise ValueError(f"{ENV_VAR} must be '0' or '1', got {value!r}")
    return value == '1'


def set_cpu_fastpath(model: nn.Module, on: bool) -> nn.Module:
    """Set ``use_cpu_fastpath`` on every submodule of ``model`` that has one.

    Args:
        model (nn.Module): a layer, a backbone or a whole detector.
        on (bool): True takes the fast paths where :func:`takes_cpu_fastpath`
            allows, False always runs the stock graph.

    Returns:
        nn.Module: ``model``.

    Example:
        >>> import torch
        >>> from mmevo.layers import Involution, set_cpu_fastpath
        >>> layer = set_cpu_fastpath(Involution(16, 3), False)
        >>> takes_cpu_fastpath(layer, torch.zeros(1))
        False
    """
    if not isinstance(on, bool):
        raise TypeError(f'on must be a bool, got {type(on).__name__}')
    for module in model.modules():
        if hasattr(module, 'use_cpu_fastpath'):
            module.use_cpu_fastpath = on
    return model


def _capturing() -> bool:
    """Whether a tracer, scripter, exporter or compiler is running."""
    return (
        _tracing()
        or torch.jit.is_scripting()
        or torch.onnx.is_in_onnx_export()
    )


def _tracing() -> bool:
    """Whether a tracer or compiler runs the Python: what may start inside
    an eager fast-path body (a traced or compiled submodule)."""
    return (
        torch.jit.is_tracing()
        or torch.compiler.is_compiling()
        or torch.compiler.is_exporting()
    )


def has_hooks(module: nn.Module) -> bool:
    """Whether a forward or backward hook would see ``module``'s call or the
    call of one of its submodules.

    Args:
        module (nn.Module): any module.

    Returns:
        bool: a global module hook is registered, or a hook is registered on
        ``module`` or one of its submodules.

    Example:
        >>> import torch
        >>> conv = torch.nn.Conv2d(2, 2, 1)
        >>> block = torch.nn.Sequential(conv)
        >>> has_hooks(block)
        False
        >>> handle = conv.register_forward_hook(lambda m, i, o: None)
        >>> has_hooks(block)
        True
    """
    state = nn.modules.module
    if (
        state._global_forward_pre_hooks
        or state._global_forward_hooks
        or state._global_backward_pre_hooks
        or state._global_backward_hooks
    ):
        return True
    # A flat walk, 3x faster than ``modules()`` (no memo, no generators):
    # every fast-path module of a RedNet-50 walks its subtree per call, in
    # all 0.15 ms a forward.
    todo = [module]
    for m in todo:
        if m is None:  # a submodule registered as None
            continue
        if (
            m._forward_pre_hooks
            or m._forward_hooks
            or m._backward_pre_hooks
            or m._backward_hooks
        ):
            return True
        todo.extend(m._modules.values())
    return False


class _Scope(threading.local):
    depth = 0  # the fast-path bodies running on this thread


_SCOPE = _Scope()


class cpu_fastpath_scope:
    """The body of a module's CPU fast path, entered once
    :func:`takes_cpu_fastpath` has held for it.

    Within it (on the same thread), :func:`takes_cpu_fastpath` of the
    module's submodules skips what the module's own test covered: no hook
    is registered in the module's subtree or globally. Each submodule still
    reads its own switch and its input's device, and whether a tracer or
    compiler runs it (a submodule traced or compiled on its own). In
    RedNet-50's inference forward the walks and tests it saves took 0.7-0.9
    ms (``docs/benchmarks.md``). Hooks registered while the body runs (not
    from a hook: there is none) are seen from the next call.

    Example:
        >>> import torch
        >>> block = torch.nn.Sequential(torch.nn.Conv2d(2, 2, 1))
        >>> block.use_cpu_fastpath = True
        >>> x = torch.randn(1, 2, 3, 3)
        >>> if takes_cpu_fastpath(block, x):
        ...     with cpu_fastpath_scope():
        ...         y = block[0](x)  # its layers' tests are a few reads
    """

    __slots__ = ()

    def __enter__(self):
        _SCOPE.depth += 1

    def __exit__(self, *exc_info):
        _SCOPE.depth -= 1


def takes_cpu_fastpath(module: nn.Module, x: torch.Tensor) -> bool:
    """Whether ``module``, called on ``x``, takes its CPU fast path.

    Args:
        module (nn.Module): a module with a ``use_cpu_fastpath`` attribute.
        x (Tensor): its input.

    Returns:
        bool: the switch is on, ``x`` is on the CPU, nothing is tracing /
        scripting / exporting / compiling, and no hook would miss a module
        call (:func:`has_hooks`); within a :func:`cpu_fastpath_scope`, whose
        module's test covered the hooks, the rest.
    """
    if not (module.use_cpu_fastpath and x.is_cpu):
        return False
    if _SCOPE.depth:
        return not _tracing()
    return not (_capturing() or has_hooks(module))


def takes_fused_cpu(
    module: nn.Module, x: torch.Tensor, dtype: torch.dtype
) -> bool:
    """Whether an evolution layer's fused C++ op takes the call on ``x``.

    Args:
        module (nn.Module): an :class:`~mmevo.layers.EvolutionLayer` with a
            ``use_cpu_fastpath`` attribute.
        x (Tensor): its input.
        dtype (torch.dtype): the dtype of the layer's weights.

    Returns:
        bool: :func:`takes_cpu_fastpath` holds, no kernel hook waits for the
        kernel (the fused op never writes it), ``x`` has the weights' dtype,
        autocast is off (the stock graph casts op by op) and the C++
        backend runs ``x`` (no other one forced).
    """
    return (
        not module._kernel_hooks
        and x.dtype == dtype
        and not torch.is_autocast_enabled('cpu')
        and takes_cpu_fastpath(module, x)
        and backend_name(x) == 'cpp'
    )


def call_cpu_kernel(op: torch._ops.OpOverload, *args):
    """``op(*args)``, for a fast path whose C++ kernel takes the call
    (:func:`takes_fused_cpu`).

    With nothing to differentiate and plain tensors, the C++ CPU kernel
    itself, which checks its arguments: the operator's Python layers, its
    ``torch.library`` autograd and the backend choice, took 35 us a call,
    2-3x a small map's kernel (17 calls in RedNet-50's forward). Otherwise,
    and while something watches operator calls (which the kernel call would
    bypass: a profiler, a torch-function or dispatch mode such as a FLOP
    counter or fake tensors, a functorch transform), the operator through
    every layer.

    Args:
        op (OpOverload): a ``torch.ops.mmevo`` operator with a C++ kernel.
        *args: its arguments.

    Returns:
        The operator's result.

    Example:
        >>> import torch
        >>> x, z = torch.randn(1, 16, 5, 5), torch.randn(1, 4, 5, 5)
        >>> span = torch.nn.Conv2d(4, 9, 1)
        >>> op = torch.ops.mmevo.fused_involution.default
        >>> with torch.no_grad():
        ...     y = call_cpu_kernel(op, x, z, span.weight, span.bias, 3,
        ...                         1, 1, 1)
        >>> y.shape
        torch.Size([1, 16, 5, 5])
    """
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    if (
        _differentiates(*tensors)
        or torch._C._autograd._profiler_enabled()
        or torch._C._len_torch_dispatch_stack()
        or torch._C._is_torch_function_mode_enabled()
        or torch._C._are_functorch_transforms_active()
        or any(type(t) not in _PLAIN_TENSORS for t in tensors)
    ):
        return op(*args)
    return cpp_backend.call(op, *args)


_PLAIN_TENSORS = (torch.Tensor, nn.Parameter)


def is_plain_conv1x1(conv: nn.Module) -> bool:
    """A plain, ungrouped, unpadded 1x1 ``nn.Conv2d`` (any stride)."""
    return (
        type(conv) is nn.Conv2d
        and conv.kernel_size == (1, 1)
        and conv.padding == (0, 0)
        and conv.dilation == (1, 1)
        and conv.groups == 1
    )


# Below this many pixels per image, the weight gradient is one matmul over
# all B * H * W pixels (after a transpose of the small operands) instead of B
# matmuls summed: with K = H * W that short, the B products are ~2x slower.
_SINGLE_MATMUL_PIXELS = 100


def _pointwise_rows(x, weight, bias):
    """The 1x1 convolution as (B, C_out, H * W)."""
    B, C, H, W = x.shape
    C_out = weight.shape[0]
    y = torch.bmm(
        weight.view(1, C_out, C).expand(B, -1, -1), x.reshape(B, C, H * W)
    )
    if bias is not None:
        # In place: bmm's backward does not need y, and a second buffer the
        # size of a whole generated kernel costs more than the add.
        y.add_(bias.view(1, -1, 1))
    return y


def _pointwise_forward(x, weight, bias):
    B, _, H, W = x.shape
    return _pointwise_rows(x, weight, bias).view(B, weight.shape[0], H, W)


def _onednn_conv1x1(x, weight, bias=None):
    return torch.mkldnn_convolution(
        x.contiguous(), weight, bias, [0, 0], [1, 1], [1, 1], 1
    )


def _onednn_conv1x1_input_grad(grad, weight):
    """The input gradient of a 1x1 convolution by ``weight``, as oneDNN's
    transposed convolution of ``grad`` by ``weight`` as it is. A
    convolution by the transposed weight would first copy it with strided
    reads: at ResNet-50's 7² widths 1.7-2.3x this time, 3-4% of a
    RedNet-50 train step on one thread (``docs/benchmarks.md``). Not
    differentiable: a double backward takes that convolution."""
    return torch.ops.mkldnn._convolution_transpose_pointwise(
        grad.contiguous(),
        weight,
        None,
        [0, 0],
        [0, 0],
        [1, 1],
        [1, 1],
        1,
        'none',
        [],
        '',
    )


class _Pointwise(torch.autograd.Function):
    """A 1x1 convolution whose weight gradient is a matmul; y and grad_x
    are matmuls too, or (``onednn``) oneDNN's 1x1 convolutions.

    oneDNN's 1x1 conv backward is 1.5-10x slower on CPU than bmm's at the
    generation convs' widths; on AMD EPYC PyTorch's native 1x1 kernel,
    which it takes on one thread, is as slow as bmm, and oneDNN's forward
    1.6-2.6x faster.
    """

    @staticmethod
    def forward(ctx, x, weight, bias, onednn=False):
        # The inputs themselves (not views made here): double backward
        # differentiates through them.
        ctx.save_for_backward(x, weight)
        ctx.has_bias = bias is not None
        ctx.onednn = onednn
        if onednn:
            return _onednn_conv1x1(x, weight, bias)
        # Its rows: a view made here could not be modified in place (an
        # in-place activation after the conv); pointwise() views them.
        return _pointwise_rows(x, weight, bias)

    @staticmethod
    def backward(ctx, grad):
        x, weight = ctx.saved_tensors
        B, C, H, W = x.shape
        C_out, HW = weight.shape[0], H * W
        # In the dtype the forward ran in (autocast's, if it was on).
        g3 = grad.reshape(B, C_out, HW)
        x3 = x.reshape(B, C, HW).to(g3.dtype)
        w2 = weight.view(C_out, C).to(g3.dtype)
        grad_x = grad_w = grad_b = None
        if ctx.needs_input_grad[0]:
            if ctx.onednn and not torch.is_grad_enabled():
                grad_x = _onednn_conv1x1_input_grad(grad, weight)
            elif ctx.onednn:  # create_graph: a differentiable convolution
                w_t = w2.t().reshape(C, C_out, 1, 1)
                grad_x = _onednn_conv1x1(grad, w_t)
            else:
                grad_x = torch.bmm(w2.t().expand(B, -1, -1), g3)
                grad_x = grad_x.view(B, C, H, W)
        with_b = ctx.has_bias and ctx.needs_input_grad[2]
        if ctx.needs_input_grad[1]:
            if with_b:
                # A row of ones: the bias gradient comes out of the same
                # matmul instead of another pass over the (kernel-sized) grad.
                x3 = torch.cat([x3, x3.new_ones(B, 1, HW)], 1)
            rows = x3.shape[1]
            if HW < _SINGLE_MATMUL_PIXELS:
                grad_wb = torch.mm(
                    g3.transpose(0, 1).reshape(C_out, B * HW),
                    x3.transpose(0, 1).reshape(rows, B * HW).t(),
                )
            else:
                grad_wb = torch.bmm(g3, x3.transpose(1, 2)).sum(0)
            grad_w = grad_wb[:, :C].reshape_as(weight)
            if with_b:
                grad_b = grad_wb[:, C]
        elif with_b:
            grad_b = g3.sum((0, 2))
        return grad_x, grad_w, grad_b, None


def pointwise(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor = None
) -> torch.Tensor:
    """A 1x1, stride-1, ungrouped convolution as a batched matmul.

    oneDNN's CPU 1x1 convolution (above all its backward) is slower than
    ``bmm`` below 64 channels, at the involution's generation convs (see
    :func:`conv1x1`, which takes the faster). Differentiable to any order
    (the backward is made of matmuls).

    Args:
        x (Tensor): (B, C_in, H, W).
        weight (Tensor): (C_out, C_in, 1, 1), as ``nn.Conv2d`` holds it.
        bias (Tensor, optional): (C_out,).

    Returns:
        Tensor: (B, C_out, H, W), equal to ``F.conv2d(x, weight, bias)``.

    Example:
        >>> import torch
        >>> conv = torch.nn.Conv2d(8, 4, 1)
        >>> x = torch.randn(2, 8, 5, 3)
        >>> y = pointwise(x, conv.weight, conv.bias)
        >>> torch.allclose(y, conv(x), atol=1e-6)
        True
    """
    B, _, H, W = x.shape
    return _Pointwise.apply(x, weight, bias).view(B, weight.shape[0], H, W)


# Below this many input or output channels a 1x1 convolution is faster as
# the matmul, above as oneDNN's, where oneDNN wins at all
# (``benchmark_ops.py --conv1x1``: oneDNN 0.66-0.86x of the matmul at
# ResNet-50's widths and the involution's 14² and 7² generation convs, the
# matmul 0.70x of oneDNN at 16 -> 196, on AMD EPYC).
ONEDNN_MIN_CHANNELS = 64

CONV1X1_ENV_VAR = 'MMEVO_CONV1X1'


@functools.cache
def _cpu_vendor() -> str:
    try:
        with open('/proc/cpuinfo') as f:
            for line in f:
                if line.startswith('vendor_id'):
                    return line.split(':', 1)[1].strip()
    except OSError:
        pass
    return ''


def onednn_conv1x1_wins() -> bool:
    """Whether this host runs the wide float32 1x1 convolutions on oneDNN
    (:func:`takes_onednn_conv1x1`), from ``MMEVO_CONV1X1``: 'onednn',
    'matmul', or 'auto' (the default), oneDNN on AMD CPUs only.

    PyTorch's matmul is MKL's. On AMD EPYC (Zen) oneDNN's own kernels beat
    it, 0.66-0.86x of its time from 64 channels, and took RedNet-50 from
    0.98x to 0.81x of ResNet-50's train step; on an Intel Xeon (AVX-512,
    AMX) MKL's matmul wins, oneDNN's convolutions taking 1.1-1.6x its time
    and RedNet-50 1.08x of its step on the matmul, with one thread or two
    (``docs/benchmarks.md``). Other CPUs were not measured: the matmul.

    Returns:
        bool: oneDNN for the wide float32 1x1 convolutions.
    """
    return _onednn_wins(_conv1x1_setting())


def _onednn_wins(setting):
    if setting == 'auto':
        return _cpu_vendor() == 'AuthenticAMD'
    return setting == 'onednn'


def _conv1x1_setting() -> str:
    value = os.environ.get(CONV1X1_ENV_VAR, 'auto')
    if value not in ('auto', 'onednn', 'matmul'):
        raise ValueError(
            f"{CONV1X1_ENV_VAR} must be 'auto', 'onednn' or 'matmul', got "
            f'{value!r}'
        )
    return value


# In inference oneDNN re-lays out the weight on every call, which the
# matmul does not need. With ``MMEVO_CONV1X1`` 'auto' a 1x1 convolution
# with nothing to differentiate takes the matmul below this many
# multiply-adds (B * H * W * C_in * C_out) or with fewer input channels
# than this: in RedNet-50's B1 forward on AMD EPYC its generation convs at
# 14² and 7² take 0.37-0.77x oneDNN's time, its 64 -> 256 convs at 56²
# 0.72-0.82x with two threads and as long with one; the wide convs stay on
# oneDNN, the faster with one thread (``benchmark_ops.py
# --conv1x1-inference``, ``docs/benchmarks.md``).
INFERENCE_ONEDNN_MIN_FMAS = 2**24
INFERENCE_ONEDNN_MIN_IN_CHANNELS = 128


def _differentiates(*tensors: torch.Tensor | None) -> bool:
    """Whether autograd records a graph through any of ``tensors``."""
    return torch.is_grad_enabled() and any(
        t is not None and t.requires_grad for t in tensors
    )


def takes_onednn_conv1x1(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None
) -> bool:
    """Whether :func:`conv1x1` runs a 1x1 convolution of ``x`` on oneDNN:
    a CPU tensor, float32 (oneDNN's other dtypes were not measured to win),
    at least :data:`ONEDNN_MIN_CHANNELS` input and output channels, oneDNN
    available and enabled (``torch.backends.mkldnn``), autocast off, on a
    host where oneDNN wins (:func:`onednn_conv1x1_wins`); in inference
    (nothing to differentiate) with ``MMEVO_CONV1X1`` 'auto', at least
    :data:`INFERENCE_ONEDNN_MIN_IN_CHANNELS` input channels and
    :data:`INFERENCE_ONEDNN_MIN_FMAS` multiply-adds as well."""
    return _onednn_route(x, weight, _differentiates(x, weight, bias))


def _onednn_route(x, weight, differentiates):
    """:func:`takes_onednn_conv1x1`, given whether the call differentiates:
    the size test first, which settles most inference calls at once."""
    setting = _conv1x1_setting()
    if (
        setting == 'auto'
        and not differentiates
        and (
            x.shape[1] < INFERENCE_ONEDNN_MIN_IN_CHANNELS
            or x.numel() * weight.shape[0] < INFERENCE_ONEDNN_MIN_FMAS
        )
    ):
        return False
    return (
        x.is_cpu
        and x.dtype == weight.dtype == torch.float32
        and min(weight.shape[:2]) >= ONEDNN_MIN_CHANNELS
        and torch.backends.mkldnn.is_available()
        and torch.backends.mkldnn.enabled
        and not torch.is_autocast_enabled('cpu')
        and _onednn_wins(setting)
    )


def conv1x1(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor = None
) -> torch.Tensor:
    """A 1x1, stride-1, ungrouped convolution, on the faster of oneDNN and
    the matmul (:func:`pointwise`).

    oneDNN where :func:`takes_onednn_conv1x1` holds, the matmul otherwise;
    with nothing to differentiate, their forwards called directly (no
    autograd function, PyTorch's ``conv2d`` dispatch skipped).
    PyTorch itself runs a 1x1 convolution on oneDNN only with more than one
    thread or a batch of 16 or more, and otherwise on its native kernel, as
    slow as the matmul: there ``y`` and the input gradient are oneDNN's
    convolutions and the weight gradient a matmul (oneDNN's weight
    gradient is not reachable on one thread); on AMD EPYC 0.67-0.8x of the
    native train step at ResNet-50's widths from 28² down
    (``docs/benchmarks.md``).
    Arguments and result as :func:`pointwise`'s.

    Example:
        >>> import torch
        >>> conv = torch.nn.Conv2d(64, 64, 1)
        >>> x = torch.randn(2, 64, 5, 3)
        >>> y = conv1x1(x, conv.weight, conv.bias)
        >>> torch.allclose(y, conv(x), atol=1e-5)
        True
    """
    differentiates = _differentiates(x, weight, bias)
    if not _onednn_route(x, weight, differentiates):
        if differentiates:
            return pointwise(x, weight, bias)
        return _pointwise_forward(x, weight, bias)
    if not differentiates and x.is_contiguous():
        return _onednn_conv1x1(x, weight, bias)
    if torch.get_num_threads() > 1 or x.shape[0] >= 16:
        return F.conv2d(x, weight, bias)  # PyTorch takes oneDNN itself
    return _Pointwise.apply(x, weight, bias, True)


def takes_avg_pool_conv(x: torch.Tensor, pool: nn.Module) -> bool:
    """Whether :func:`avg_pool` runs ``pool(x)`` as a depthwise
    convolution: a plain ``nn.AvgPool2d`` whose window is its stride, square,
    unpadded, without a divisor override, on an NCHW float32 CPU ``x``
    whose height and width it divides (every window whole), oneDNN enabled,
    autocast off (which would cast the convolution, not the pool)."""
    if type(pool) is not nn.AvgPool2d:
        return False
    k = pool.kernel_size
    return (
        isinstance(k, int)
        and pool.stride in (k, (k, k))
        and pool.padding in (0, (0, 0))
        and pool.divisor_override is None
        and x.device.type == 'cpu'
        and x.dtype == torch.float32
        and x.dim() == 4
        and x.is_contiguous()  # ATen's channels-last pool is fast
        and x.shape[-2] % k == 0
        and x.shape[-1] % k == 0
        and torch.backends.mkldnn.is_available()
        and torch.backends.mkldnn.enabled
        and not torch.is_autocast_enabled('cpu')
    )


def avg_pool(x: torch.Tensor, pool: nn.Module) -> torch.Tensor:
    """``pool(x)``, where :func:`takes_avg_pool_conv` holds as the depthwise
    k x k, stride-k convolution by 1 / k² (exact in binary: the same sums
    to float rounding): oneDNN runs it 2-3x faster than ATen's NCHW
    average pool, forward and backward (``docs/benchmarks.md``), at the
    strided involutions' maps. Anything else calls ``pool`` itself. For
    the CPU fast paths, which call it only where no hook waits for
    ``pool``'s call.

    Args:
        x (Tensor): (B, C, H, W).
        pool (nn.Module): the ``nn.AvgPool2d``, or any module.

    Returns:
        Tensor: ``pool(x)``.

    Example:
        >>> import torch
        >>> pool = torch.nn.AvgPool2d(2, 2, ceil_mode=True)
        >>> x = torch.randn(1, 3, 4, 6)
        >>> torch.allclose(avg_pool(x, pool), pool(x))
        True
    """
    if not takes_avg_pool_conv(x, pool):
        return pool(x)
    k, C = pool.kernel_size, x.shape[1]
    weight = x.new_full((C, 1, k, k), 1.0 / (k * k))
    return F.conv2d(x, weight, None, k, 0, 1, C)


class _BatchNormTrain(torch.autograd.Function):
    """``F.batch_norm`` in training on ``mmevo::batch_norm_train`` and its
    backward (ATen's CPU forward takes 2.2-4.3x the time on NCHW maps, its
    backward up to 1.5x), updating the running statistics as it does; plus
    ``residual`` if given, and with ``relu`` the ReLU of that, in the same
    pass. The backward masks the gradient by the output in its own pass,
    where the ReLU's backward would write a masked copy of it (only the
    residual's gradient is that copy). Twice differentiable: under
    ``create_graph`` the backward recomputes the stock batch norm (add and
    ReLU) with the same batch statistics and differentiates it."""

    @staticmethod
    def forward(
        ctx,
        x,
        weight,
        bias,
        residual,
        running_mean,
        running_var,
        momentum,
        eps,
        relu,
    ):
        out, mean, invstd = torch.ops.mmevo.batch_norm_train(
            x,
            weight,
            bias,
            running_mean,
            running_var,
            momentum,
            eps,
            relu,
            residual,
        )
        ctx.save_for_backward(
            x, weight, bias, mean, invstd, out if relu else None
        )
        ctx.eps = eps
        ctx.relu = relu
        ctx.with_residual = residual is not None
        return out

    @staticmethod
    def backward(ctx, grad):
        x, weight, _, mean, invstd, out = ctx.saved_tensors
        needs = ctx.needs_input_grad[:4]
        if torch.is_grad_enabled():  # create_graph
            return *_batch_norm_double_backward(ctx, grad), *[None] * 5
        grad = grad.contiguous()
        grad_x, grad_w, grad_b, grad_r = (
            torch.ops.mmevo.batch_norm_train_backward(
                grad,
                x,
                weight,
                mean,
                invstd,
                list(needs[:3]),  # a None weight or bias needs no gradient
                out,
                ctx.relu and needs[3],
            )
        )
        if needs[3] and not ctx.relu:
            grad_r = grad
        return grad_x, grad_w, grad_b, grad_r, *[None] * 5


def _batch_norm_double_backward(ctx, grad):
    """The gradients of (x, weight, bias, residual) of the stock batch norm
    (plus residual, ReLU) recomputed with the forward's batch statistics,
    as a graph (``create_graph``)."""
    x, weight, bias, _, _, out = ctx.saved_tensors
    needs = ctx.needs_input_grad[:4]
    # y is linear in the residual, which is not saved: a zero leaf in its
    # place gives the same derivatives, and the ReLU's are its mask, out > 0.
    residual = (
        torch.zeros_like(x, requires_grad=True) if ctx.with_residual else None
    )
    inputs = (x, weight, bias, residual)
    wanted = [t for t, need in zip(inputs, needs, strict=True) if need]
    with torch.enable_grad():
        y = F.batch_norm(x, None, None, weight, bias, True, 0.0, ctx.eps)
        if residual is not None:
            y = y + residual
        if ctx.relu:
            y = y * (out > 0)
    found = iter(torch.autograd.grad(y, wanted, grad, create_graph=True))
    return [next(found) if need else None for need in needs]


def takes_batch_norm_kernel(x: torch.Tensor, norm: nn.Module) -> bool:
    """Whether :func:`batch_norm` runs ``norm(x)`` on mmevo's kernel: a
    plain ``nn.BatchNorm2d`` in training that tracks running statistics,
    an NCHW float32 or float64 CPU ``x`` of its dtype with more than one
    value per channel, autocast off, the C++ extension built."""
    if type(norm) is not nn.BatchNorm2d:
        return False
    weight, _, mean, _ = _bn_tensors(norm)
    return _takes_bn_train(x, norm, mean, weight)


def takes_batch_norm_eval_kernel(
    x: torch.Tensor, norm: nn.Module, residual: torch.Tensor | None = None
) -> bool:
    """Whether :func:`batch_norm` runs ``norm(x)`` in inference on mmevo's
    kernel: a plain ``nn.BatchNorm2d`` in eval mode that normalises by its
    running statistics, an NCHW or channels-last float32 or float64 CPU
    ``x`` of their dtype, nothing to differentiate (the kernel has no
    backward: grad mode off, or no input or parameter that requires grad),
    autocast off, the C++ extension built."""
    if type(norm) is not nn.BatchNorm2d:
        return False
    weight, bias, mean, _ = _bn_tensors(norm)
    return _takes_bn_eval(x, norm, mean, weight, bias, residual)


def _bn_tensors(norm):
    """The weight, bias, running mean and variance of an ``nn.BatchNorm2d``
    from its dicts: each attribute read of an ``nn.Module`` runs its
    Python ``__getattr__``, ~1 us, and RedNet-50's inference forward runs
    73 BNs here."""
    try:
        params, buffers = norm._parameters, norm._buffers
        return (
            params['weight'],
            params['bias'],
            buffers['running_mean'],
            buffers['running_var'],
        )
    except KeyError:  # moved out of them (pruning, say)
        return norm.weight, norm.bias, norm.running_mean, norm.running_var


def _bn_kernel_reads(x, mean, weight):
    """What both BN kernels need, for a plain ``nn.BatchNorm2d`` with
    running mean ``mean`` and weight ``weight``: the running statistics,
    a 4-d float32 / float64 CPU ``x`` of their dtype (and the weight's),
    autocast off, the C++ extension built."""
    return (
        mean is not None
        and x.is_cpu
        and x.dtype in (torch.float32, torch.float64)
        and x.dtype == mean.dtype
        and (weight is None or weight.dtype == x.dtype)
        and x.dim() == 4
        and not torch.is_autocast_enabled('cpu')
        and cpp_backend.available()
    )


def _takes_bn_train(x, norm, mean, weight):
    return (
        norm.training
        and norm.track_running_stats
        and _bn_kernel_reads(x, mean, weight)
        and x.is_contiguous()
        and x.numel() > x.shape[1]
    )


def _takes_bn_eval(x, norm, mean, weight, bias, residual):
    return (
        not norm.training
        and _bn_kernel_reads(x, mean, weight)
        and (
            x.is_contiguous()
            or x.is_contiguous(memory_format=torch.channels_last)
        )
        and not _differentiates(x, weight, bias, residual)
    )


def batch_norm_train(
    x: torch.Tensor,
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    eps: float,
    relu: bool = False,
) -> torch.Tensor:
    """``F.batch_norm(x, None, None, weight, bias, True, 0.0, eps)`` on
    mmevo's kernel, for an ``x`` that :func:`takes_batch_norm_kernel`
    takes: a batch norm in training that updates no running statistics
    (a recomputation's); with ``relu``, ``F.relu`` of it."""
    return _BatchNormTrain.apply(
        x, weight, bias, None, None, None, 0.0, eps, relu
    )


def batch_norm(
    x: torch.Tensor,
    norm: nn.Module,
    act: nn.Module | None = None,
    residual: torch.Tensor | None = None,
    inplace: bool = False,
) -> torch.Tensor:
    """``norm(x)``, or ``act(norm(x) + residual)`` (each of ``act`` and
    ``residual`` optional), where :func:`takes_batch_norm_kernel` holds
    computed by a kernel that reads each channel once from memory (ATen's
    CPU forward of a training batch norm takes 2.2-4.3x its time on
    ResNet-50's NCHW maps, ``docs/benchmarks.md``): the same numbers to
    float rounding, the same running statistics and batch count. A
    ``residual`` of ``x``'s shape, dtype and layout and an ``act`` that is
    an ``nn.ReLU`` run in the kernel's pass, and their backward in the BN's
    (no add or ReLU pass, no masked gradient map but the residual's). In
    inference (:func:`takes_batch_norm_eval_kernel`, NCHW or channels-last)
    the norm by its running statistics, the residual and the ReLU are one
    pass too, where ATen makes three. For the CPU fast paths, which call it
    only where no hook waits for ``norm``'s or ``act``'s call.

    Args:
        x (Tensor): (B, C, H, W).
        norm (nn.Module): the batch norm, or any module (called as it is
            where the kernel does not take it).
        act (nn.Module, optional): the activation after it, or any module
            (called as it is where the kernel does not take it).
        residual (Tensor, optional): added to ``norm(x)`` before ``act``
            (in place where the kernel does not take it, as mmdet's blocks
            add their shortcut).
        inplace (bool): In inference on the kernel, write the result over
            ``x`` (``mmevo::batch_norm_eval_``): for a caller's own
            temporary, which no one else reads, so that no second map is
            allocated. Default: False.

    Returns:
        Tensor: ``act(norm(x) + residual)``, without the parts not given.

    Example:
        >>> import torch
        >>> bn = torch.nn.BatchNorm2d(4)
        >>> x, r = torch.randn(2, 4, 3, 3), torch.randn(2, 4, 3, 3)
        >>> y = batch_norm(x, bn, torch.nn.ReLU(), r)
        >>> torch.allclose(y, torch.relu(torch.nn.functional.batch_norm(
        ...     x, None, None, bn.weight, bn.bias, True) + r), atol=1e-5)
        True
    """
    if type(norm) is not nn.BatchNorm2d:
        return _add_act(norm(x), act, residual)
    weight, bias, mean, var = _bn_tensors(norm)
    if _takes_bn_eval(x, norm, mean, weight, bias, residual):
        train = False
    elif _takes_bn_train(x, norm, mean, weight):
        train = True
    else:
        return _add_act(norm(x), act, residual)
    relu = type(act) is nn.ReLU
    fused = residual is None
    if not fused:
        # The kernels read a residual in x's layout (the training one takes
        # NCHW only); NCHW where x is both.
        layout = (
            torch.contiguous_format
            if x.is_contiguous()
            else torch.channels_last
        )
        fused = (
            residual.shape == x.shape
            and residual.dtype == x.dtype
            and residual.device == x.device
            and residual.is_contiguous(memory_format=layout)
        )
    if train:
        y = _batch_norm_train_module(
            x, norm, residual if fused else None, relu and fused
        )
    else:
        op = (
            torch.ops.mmevo.batch_norm_eval_
            if inplace
            else torch.ops.mmevo.batch_norm_eval
        )
        y = op(
            x,
            weight,
            bias,
            mean,
            var,
            norm.eps,
            relu and fused,
            residual if fused else None,
        )
    if fused:
        return y if act is None or relu else act(y)
    return _add_act(y, act, residual)


def _batch_norm_train_module(x, norm, residual, relu):
    """``_BatchNormTrain`` for a training ``norm``, counting its batches."""
    # As nn.BatchNorm2d.forward counts batches and picks the momentum.
    norm.num_batches_tracked.add_(1)
    momentum = norm.momentum
    if momentum is None:  # a cumulative moving average
        momentum = 1.0 / float(norm.num_batches_tracked)
    return _BatchNormTrain.apply(
        x,
        norm.weight,
        norm.bias,
        residual,
        norm.running_mean,
        norm.running_var,
        momentum,
        norm.eps,
        relu,
    )


def _add_act(y, act, residual):
    if residual is not None:
        y += residual
    return y if act is None else act(y)
