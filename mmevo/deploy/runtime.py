"""Exported models run from Python, called like the PyTorch ones: an ONNX
model in onnxruntime (:class:`OnnxModel`); what an exported graph takes
(:class:`InputSpec`), which both runtimes check each input against."""

import math
import sys

import torch

_DIM_NAMES = ('batch', 'channels', 'height', 'width')
# onnxruntime's input types
_ONNX_DTYPES = {
    'tensor(float)': torch.float32,
    'tensor(double)': torch.float64,
    'tensor(float16)': torch.float16,
    'tensor(bfloat16)': torch.bfloat16,
    'tensor(int64)': torch.int64,
    'tensor(int32)': torch.int32,
    'tensor(uint8)': torch.uint8,
    'tensor(bool)': torch.bool,
}


class InputMismatchError(ValueError):
    """An input that does not fit an exported graph (one line).

    Args:
        message (str): The whole message.
        problems (Sequence[str]): Each mismatch alone, e.g.
            ``'height 48, expected 64'``.
    """

    def __init__(self, message, problems=()):
        super().__init__(message)
        self.problems = list(problems)


def _bound(value):
    """An int bound, or None for torch.export's 'no bound' (``int_oo``,
    printed as int64's largest values)."""
    try:
        value = int(value)
    except (TypeError, ValueError, AttributeError, OverflowError):
        return None
    return None if value >= sys.maxsize - 2 else value


def _guard_scope(x, name):
    """The names torch.export's guards are written in, as its
    ``program.module()`` evaluates them, with ``L[name]`` the input."""
    from torch.fx.experimental.symbolic_shapes import SYMPY_INTERP

    return {**SYMPY_INTERP, 'math': math, 'inf': math.inf, 'L': {name: x}}


class InputSpec:
    """What an exported graph takes as its input: the rank, each
    dimension's size (fixed) or bounds (dynamic), the dtype and the device.

    Args:
        dims (Sequence[tuple[int, int | None]]): ``(low, high)`` per
            dimension: ``low == high`` for a fixed size, ``high`` None for
            no upper bound.
        dtype (torch.dtype): The input's dtype.
        device (str, optional): The device type the graph runs on
            ('cpu', 'cuda'); None for any (the runtime moves the input).
        static (bool): Whether the graph was exported for one size (the
            hint of its message). Default: False.
        guards (Sequence[str]): Conditions on the sizes that torch.export
            recorded with the graph (``ExportedProgram``'s guards, Python
            over ``L['<input name>']``), checked with the bounds: a graph
            traced where a size was 1 (a Swin stage of one window) holds
            only where it is 1 again, and a package computes wrong numbers
            elsewhere. Default: none.
        name (str): The input's name in ``guards``. Default: 'x'.

    Example:
        >>> spec = InputSpec([(1, 1), (3, 3), (64, 64), (64, 64)],
        ...                  torch.float32, 'cpu', static=True)
        >>> spec.check(torch.randn(1, 3, 48, 48))
        ValueError: input (1, 3, 48, 48) float32 on cpu does not fit ...
    """

    def __init__(
        self, dims, dtype, device=None, static=False, guards=(), name='x'
    ):
        self.dims = [
            (int(lo), None if hi is None else int(hi)) for lo, hi in dims
        ]
        self.dtype = dtype
        self.device = device
        self.static = static
        self.guards = [str(g) for g in guards]
        self.name = name

    @classmethod
    def of_program(cls, program):
        """The specs of ``program``'s tensor inputs (a
        ``torch.export.ExportedProgram``): fixed sizes, and the ranges
        torch.export recorded for the dynamic ones."""
        nodes = {
            n.name: n for n in program.graph.nodes if n.op == 'placeholder'
        }
        inputs = program.graph_signature.user_inputs
        # the guards of a program of one input (all the tools export);
        # ``_guards_code`` is what ``program.module()`` checks
        guards = getattr(program, '_guards_code', [])
        if len(inputs) != 1:
            guards = []
        specs = []
        for name in inputs:
            val = nodes[name].meta.get('val')
            if not isinstance(val, torch.Tensor):
                continue
            dims = []
            for size in val.shape:
                if isinstance(size, int):
                    dims.append((size, size))
                    continue
                expr = size.node.expr
                bounds = program.range_constraints.get(expr)
                if bounds is None:  # an expression of several symbols
                    dims.append((0, None))
                else:
                    dims.append(
                        (_bound(bounds.lower) or 0, _bound(bounds.upper))
                    )
            static = all(lo == hi for lo, hi in dims)
            specs.append(
                cls(dims, val.dtype, val.device.type, static, guards, name)
            )
        return specs

    @classmethod
    def of_onnx(cls, node_arg):
        """The spec of an onnxruntime ``NodeArg`` (``session.get_inputs()``'s):
        its integer sizes fixed, named ones dynamic."""
        dims = [
            (d, d) if isinstance(d, int) else (0, None) for d in node_arg.shape
        ]
        dtype = _ONNX_DTYPES.get(node_arg.type)
        return cls(dims, dtype, None, all(lo == hi for lo, hi in dims))

    def to_dict(self):
        """The spec as JSON-able values (:meth:`from_dict` reads them)."""
        return dict(
            dims=self.dims,
            dtype=str(self.dtype).replace('torch.', ''),
            device=self.device,
            static=self.static,
            guards=self.guards,
            name=self.name,
        )

    @classmethod
    def from_dict(cls, d):
        return cls(
            d['dims'],
            getattr(torch, d['dtype']),
            d['device'],
            d['static'],
            d.get('guards', ()),
            d.get('name', 'x'),
        )

    def _dim(self, i):
        lo, hi = self.dims[i]
        if lo == hi:
            return str(lo)
        return f'{lo}..{"inf" if hi is None else hi}'

    def __str__(self):
        dtype = str(self.dtype).replace('torch.', '') if self.dtype else 'any'
        dims = ', '.join(self._dim(i) for i in range(len(self.dims)))
        where = f' on {self.device}' if self.device else ''
        return f'({dims}) {dtype}{where}'

    def problems(self, x):
        """What keeps tensor ``x`` from fitting: a list of strings, each
        naming the given and the expected."""
        if x.dim() != len(self.dims):
            return [f'{x.dim()} dimensions, expected {len(self.dims)}']
        names = (
            _DIM_NAMES
            if x.dim() == 4
            else [f'dim {i}' for i in range(x.dim())]
        )
        problems = []
        for i, (size, (lo, hi)) in enumerate(
            zip(x.shape, self.dims, strict=True)
        ):
            if size < lo or (hi is not None and size > hi):
                problems.append(f'{names[i]} {size}, expected {self._dim(i)}')
        if self.dtype is not None and x.dtype != self.dtype:
            problems.append(
                f'dtype {str(x.dtype).replace("torch.", "")}, expected '
                f'{str(self.dtype).replace("torch.", "")}'
            )
        if self.device is not None and x.device.type != self.device:
            problems.append(f'device {x.device}, expected {self.device}')
        if problems:
            return problems
        scope = _guard_scope(x, self.name)
        failed = [g for g in self.guards if not eval(g, scope)]
        if failed:
            where = failed[0].replace(f"L['{self.name}']", 'x')
            more = f' (and {len(failed) - 1} more)' if len(failed) > 1 else ''
            problems.append(f'sizes where {where} is false{more}')
        return problems

    def check(self, x, name='the graph'):
        """Raise unless tensor ``x`` fits.

        Args:
            x (Tensor): The input.
            name (str): The graph in the message, e.g. "package 'x.pt2'".

        Raises:
            TypeError: ``x`` is no tensor.
            InputMismatchError: A ``ValueError`` of one line: what ``x``
                is, what ``name`` takes, each dimension (or the dtype, the
                device) that differs.
        """
        if not isinstance(x, torch.Tensor):
            raise TypeError(
                f'{name} takes a tensor {self}, got {type(x).__name__}'
            )
        problems = self.problems(x)
        if not problems:
            return
        given = str(tuple(x.shape)) + ' ' + str(x.dtype).replace('torch.', '')
        hint = ''
        sizes = any(p.startswith(('height', 'width')) for p in problems)
        if any(p.startswith('sizes where') for p in problems):
            hint = (
                '; torch.export traced it under that condition, true at the '
                'example: export it at a size like this one (a Swin '
                'backbone: at least two windows a side in every stage)'
            )
        elif sizes and self.static:
            h, w = x.shape[2:]
            hint = (
                '; it was exported for one size: export it at this size '
                f'(--shape {h} {w}), or with dynamic sizes (--dynamic)'
            )
        elif any(p.startswith('batch') for p in problems):
            hint = (
                f'; its batch is fixed at export: give {self._dim(0)} '
                'image(s) a call'
            )
        raise InputMismatchError(
            f'{name} takes {self}, got {given} on {x.device}: '
            f'{"; ".join(problems)}{hint}',
            problems,
        )


class OnnxModel:
    """An ONNX model in onnxruntime (CPU), called like the PyTorch one.

    Each input is checked against the graph's input
    (:attr:`input_spec`): a wrong rank, batch, dtype or, for a graph of
    fixed sizes, another size is a ``ValueError`` naming the expected and
    the given.

    Args:
        path (str): the ``.onnx`` file.
        threads (int, optional): onnxruntime's intra-op threads; default:
            torch's thread count.
        name (str, optional): the model in messages; default:
            ``"ONNX model '<path>'"``.

    Example:
        >>> outputs = OnnxModel('model.onnx')(torch.randn(1, 3, 64, 64))
    """

    def __init__(self, path, threads=None, name=None):
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads = threads or torch.get_num_threads()
        options.inter_op_num_threads = 1
        # its errors are raised (one line each), not also logged
        options.log_severity_level = 4
        self.path = str(path)
        self.name = name or f"ONNX model '{self.path}'"
        self.session = ort.InferenceSession(
            self.path, options, providers=['CPUExecutionProvider']
        )
        graph_input = self.session.get_inputs()[0]
        self.input_name = graph_input.name
        #: what a call takes (:class:`InputSpec`)
        self.input_spec = InputSpec.of_onnx(graph_input)
        #: how many tensors a call returns
        self.num_outputs = len(self.session.get_outputs())

    def __call__(self, x):
        """Tuple of output tensors for the input ``x`` (a tensor)."""
        self.input_spec.check(x, self.name)
        outs = self.session.run(
            None, {self.input_name: x.detach().cpu().contiguous().numpy()}
        )
        return tuple(torch.from_numpy(o) for o in outs)
