"""Argument checks of the evolution ops, shared by every entry, and the
window they resolve.

The public functions (:mod:`mmevo.ops.evolution`) resolve their defaults
into a :class:`Window` with :meth:`Window.resolve`; every ``torch.ops.mmevo``
operator then checks its resolved arguments with :func:`check_aggregate`,
:func:`check_correlation` or :func:`check_transpose`, on every backend and
in its fake kernel. The C++ operators (``csrc/ops.cpp``) make the same checks
in the same order, with the same messages, for callers without Python.
"""

import dataclasses

import torch

PADDING_MODES = ('zeros', 'reflect')
DTYPES = (torch.float64, torch.float32, torch.bfloat16, torch.float16)
INT64_MAX = 2**63 - 1


def check_int(name: str, value: int, minimum: int = 1) -> None:
    """Raise a clear error unless ``value`` is an int64 >= ``minimum``.

    Args:
        name (str): the argument's name, for the message.
        value: the value to check (a bool is not an int here).
        minimum (int): the smallest value allowed. Default: 1.

    Example:
        >>> check_int('stride', 2)
        >>> check_int('padding', -1, minimum=0)
        Traceback (most recent call last):
        ...
        ValueError: padding must be >= 0, got -1
    """
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(
            f'{name} must be an int, got {type(value).__name__} {value!r}'
        )
    if value < minimum:
        raise ValueError(f'{name} must be >= {minimum}, got {value}')
    if value > INT64_MAX:
        raise ValueError(f'{name} must be < 2**63 (an int64), got {value}')


def check_span(kernel_size: int, dilation: int) -> None:
    """The window span (kernel_size - 1) * dilation must fit in int64."""
    if (kernel_size - 1) * dilation > INT64_MAX:
        raise ValueError(
            f'dilation={dilation} with kernel_size={kernel_size}: the window '
            f'span (kernel_size - 1) * dilation does not fit in int64'
        )


def _check_window(kernel_size, stride, dilation, padding_mode):
    check_int('kernel_size', kernel_size, 1)
    check_int('stride', stride, 1)
    check_int('dilation', dilation, 1)
    if padding_mode not in PADDING_MODES:
        raise ValueError(
            f'padding_mode must be one of {PADDING_MODES}, '
            f'got {padding_mode!r}'
        )
    check_span(kernel_size, dilation)


@dataclasses.dataclass(frozen=True)
class Window:
    """The window of an evolution op, resolved: what every backend, the
    reference and the decompositions take (the operator schemas keep the
    scalars, :meth:`scalars`).

    Args:
        kernel_size (int): K.
        stride (int): the step between windows.
        padding (int): on every side.
        dilation (int): the spacing of the window taps.
        padding_mode (str): one of :data:`PADDING_MODES`.

    Example:
        >>> w = Window.resolve(7, 1, None, 2, 'zeros')
        >>> w.padding, w.output_size(56)
        (6, 56)
    """

    kernel_size: int
    stride: int = 1
    padding: int = 0
    dilation: int = 1
    padding_mode: str = 'zeros'

    @classmethod
    def resolve(
        cls,
        kernel_size: int,
        stride: int,
        padding: int | None,
        dilation: int,
        padding_mode: str,
    ) -> 'Window':
        """The window of the public arguments, checked, padding None
        ("same") resolved as :func:`resolve_window` says."""
        padding = resolve_window(
            kernel_size, stride, padding, dilation, padding_mode
        )
        return cls(kernel_size, stride, padding, dilation, padding_mode)

    @property
    def reflects(self) -> bool:
        """Whether any tap reads reflect padding."""
        return self.padding_mode == 'reflect' and self.padding > 0

    def zero_padded(self, padding: int | None = None) -> 'Window':
        """This window with zero padding (``padding``, default its own): the
        window of a map padded explicitly."""
        return dataclasses.replace(
            self,
            padding=self.padding if padding is None else padding,
            padding_mode='zeros',
        )

    def output_size(self, size: int) -> int:
        """The output size along a map dimension of ``size``."""
        return output_size(
            size, self.kernel_size, self.stride, self.padding, self.dilation
        )

    def scalars(self) -> tuple[int, int, int, str]:
        """(stride, padding, dilation, padding_mode): the window's
        arguments of the operator schemas, after their sizes."""
        return self.stride, self.padding, self.dilation, self.padding_mode


def resolve_window(
    kernel_size: int,
    stride: int,
    padding: int | None,
    dilation: int,
    padding_mode: str,
) -> int:
    """Check the window arguments; return the padding ('same' resolved).

    Args:
        kernel_size (int): K, >= 1.
        stride (int): >= 1.
        padding (int | None): >= 0, or None for "same",
            ``dilation * (K - 1) // 2`` (K must be odd).
        dilation (int): >= 1.
        padding_mode (str): one of :data:`PADDING_MODES`.

    Returns:
        int: the padding on every side.

    Example:
        >>> resolve_window(7, 1, None, 2, 'zeros')
        6
    """
    _check_window(kernel_size, stride, dilation, padding_mode)
    if padding is None:
        if kernel_size % 2 == 0:
            raise ValueError(
                f'padding=None ("same") needs an odd kernel_size, '
                f'got {kernel_size}; pass padding explicitly'
            )
        return dilation * (kernel_size - 1) // 2
    check_int('padding', padding, 0)
    return padding


def output_size(
    size: int, kernel_size: int, stride: int, padding: int, dilation: int
) -> int:
    """Convolution output size rule: floor((H + 2p - d(K-1) - 1) / s) + 1.

    Example:
        >>> output_size(9, 3, 2, 1, 1)
        5
    """
    return (
        size + 2 * padding - dilation * (kernel_size - 1) - 1
    ) // stride + 1


def check_tensor(name: str, t: torch.Tensor, ndim: int, layout: str) -> None:
    """``t`` must be a floating point tensor of ``ndim`` dims
    (``layout``, e.g. '(B, C, H, W)', for the message)."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f'{name} must be a Tensor, got {type(t).__name__}')
    if t.dim() != ndim:
        raise ValueError(f'{name} must be {layout}, got {tuple(t.shape)}')
    if t.dtype not in DTYPES:
        raise TypeError(
            f'{name} must be a floating point tensor (float64, float32, '
            f'bfloat16 or float16), got {t.dtype}'
        )


def check_pair(
    name_a: str, a: torch.Tensor, name_b: str, b: torch.Tensor
) -> None:
    """Same dtype and device."""
    if a.dtype != b.dtype:
        raise TypeError(
            f'{name_a} and {name_b} must have the same dtype, '
            f'got {a.dtype} and {b.dtype}'
        )
    if a.device != b.device:
        raise ValueError(
            f'{name_a} and {name_b} must be on the same device, '
            f'got {a.device} and {b.device}'
        )


def map_size(name: str, size: int, window: Window) -> int:
    """The output size along one map dimension of ``size``, checked: the
    map is not empty, its padded size fits in int64, the output is not
    empty."""
    if size < 1:  # B = 0 and C = 0 are fine, an empty map has no windows
        raise ValueError(f'{name} must be >= 1, got {size}')
    padding = window.padding
    if size + 2 * padding > INT64_MAX:
        raise ValueError(
            f'padding={padding} with {name} {size}: {name} + 2 '
            f'* padding does not fit in int64'
        )
    out = window.output_size(size)
    if out < 1:
        raise ValueError(
            f'{name} of {size} is too small for kernel_size='
            f'{window.kernel_size}, dilation={window.dilation}, '
            f'padding={padding}: output would be empty'
        )
    return out


def kernel_size_of(kernel: torch.Tensor) -> int:
    """K of a (B, G, K, K, H_out, W_out) kernel map."""
    K = int(kernel.shape[2])
    if int(kernel.shape[3]) != K:
        raise ValueError(
            f'kernel must be (B, G, K, K, H_out, W_out) with the '
            f'same K in both window dims, got {tuple(kernel.shape)}'
        )
    return K


def size_of(n):
    """A size as an int: under torch.jit.trace (FLOP counting) sizes come
    back as tensors. A SymInt stays symbolic: int() would freeze a dynamic
    size of torch.export (AOTInductor) to the example's."""
    return int(n) if isinstance(n, torch.Tensor) else n


def _check_groups(name, C, G, kernel):
    if G < 1 or C % G:
        raise ValueError(
            f'{name} channels ({C}) must be divisible by the '
            f'kernel groups G={G}; kernel {tuple(kernel.shape)}'
        )


def _check_shape(name, t, expected, layout, context):
    if tuple(t.shape) != expected:
        raise ValueError(
            f'{name} must be {layout} = {expected} for '
            f'{context}, got {tuple(t.shape)}'
        )


def _maps(name, shape, window):
    return (
        map_size(f'{name}height', size_of(shape[0]), window),
        map_size(f'{name}width', size_of(shape[1]), window),
    )


def check_aggregate(
    input: torch.Tensor,
    kernel: torch.Tensor,
    stride: int,
    padding: int,
    dilation: int,
    padding_mode: str,
    *,
    maps: bool = True,
) -> tuple[int, int] | None:
    """Every relation of ``mmevo::evolution_aggregate``'s arguments;
    returns (H_out, W_out). With ``maps=False`` (ONNX export, where the
    map sizes stay symbolic), only those that do not read the map sizes,
    returning None."""
    check_tensor('input', input, 4, '(B, C, H, W)')
    check_tensor('kernel', kernel, 6, '(B, G, K, K, H_out, W_out)')
    check_pair('input', input, 'kernel', kernel)
    K = kernel_size_of(kernel)
    _check_window(K, stride, dilation, padding_mode)
    check_int('padding', padding, 0)
    B, C = size_of(input.shape[0]), size_of(input.shape[1])
    G = size_of(kernel.shape[1])
    _check_groups('input', C, G, kernel)
    if not maps:
        return None
    window = Window(K, stride, padding, dilation, padding_mode)
    Ho, Wo = _maps('input ', input.shape[2:], window)
    _check_shape(
        'kernel',
        kernel,
        (B, G, K, K, Ho, Wo),
        '(B, G, K, K, H_out, W_out)',
        f'input {tuple(input.shape)}',
    )
    return Ho, Wo


def check_correlation(
    query: torch.Tensor,
    key: torch.Tensor,
    groups: int,
    kernel_size: int,
    stride: int,
    padding: int,
    dilation: int,
    padding_mode: str,
    *,
    maps: bool = True,
) -> tuple[int, int] | None:
    """Every relation of ``mmevo::local_correlation``'s (and
    ``local_attention_weights``') arguments; returns (H_out, W_out), or
    None with ``maps=False`` (as :func:`check_aggregate`)."""
    check_tensor('query', query, 4, '(B, C, H_out, W_out)')
    check_tensor('key', key, 4, '(B, C, H, W)')
    check_pair('query', query, 'key', key)
    check_int('groups', groups, 1)
    _check_window(kernel_size, stride, dilation, padding_mode)
    check_int('padding', padding, 0)
    B, C = size_of(key.shape[0]), size_of(key.shape[1])
    if C % groups:
        raise ValueError(
            f'key channels ({C}) must be divisible by groups={groups}'
        )
    if not maps:
        return None
    window = Window(kernel_size, stride, padding, dilation, padding_mode)
    Ho, Wo = _maps('key ', key.shape[2:], window)
    _check_shape(
        'query',
        query,
        (B, C, Ho, Wo),
        '(B, C, H_out, W_out)',
        f'key {tuple(key.shape)}',
    )
    return Ho, Wo


def check_transpose(
    grad: torch.Tensor,
    kernel: torch.Tensor,
    height: int,
    width: int,
    stride: int,
    padding: int,
    dilation: int,
    padding_mode: str,
) -> tuple[int, int]:
    """Every relation of ``mmevo::evolution_aggregate_transpose``'s
    arguments; returns (H_out, W_out)."""
    check_tensor('grad', grad, 4, '(B, C, H_out, W_out)')
    check_tensor('kernel', kernel, 6, '(B, G, K, K, H_out, W_out)')
    check_pair('grad', grad, 'kernel', kernel)
    K = kernel_size_of(kernel)
    _check_window(K, stride, dilation, padding_mode)
    check_int('padding', padding, 0)
    B, C = size_of(grad.shape[0]), size_of(grad.shape[1])
    G = size_of(kernel.shape[1])
    _check_groups('grad', C, G, kernel)
    window = Window(K, stride, padding, dilation, padding_mode)
    Ho, Wo = _maps('', (height, width), window)
    _check_shape(
        'grad',
        grad,
        (B, C, Ho, Wo),
        '(B, C, H_out, W_out)',
        f'height={height}, width={width}',
    )
    _check_shape(
        'kernel',
        kernel,
        (B, G, K, K, Ho, Wo),
        '(B, G, K, K, H_out, W_out)',
        f'grad {tuple(grad.shape)}',
    )
    return Ho, Wo
