"""AOTInductor deployment: ``torch.export`` then AOTInductor into a
``.pt2`` package, which PyTorch loads from Python (:class:`AotiModel`)
or from C++ without Python (``deploy/cpp``).

Unlike the ONNX graph, the package keeps mmevo's operators
(``torch.ops.mmevo.*``, run by mmevo's kernels): AOTInductor compiles
everything else (convolutions with their batch norms folded into the
frozen weights, the kernel generation's elementwise ops) into one C++
program that calls them. With ``inline_ops`` the package holds their
formulation in standard operators instead (:mod:`mmevo.ops.decompositions`): it
then runs where mmevo's op library is not loaded.

On CUDA the package holds mmevo's Triton kernels themselves: the ops are
exported as ``torch.library.triton_op`` s (:mod:`mmevo.ops.triton_ops`),
which AOTInductor autotunes and compiles into the package like its own
kernels, so it runs without Python and without mmevo's op library.
"""

import contextlib
import copy
import functools
import json
import os
import threading
import warnings

import torch
from torch._inductor.custom_graph_pass import (
    CustomGraphPass,
    get_hash_for_files,
)
from torch.fx.experimental.symbolic_shapes import optimization_hint

from mmevo.ops import decompositions

from .export import naming_failing_layer
from .rewrites import AOTI_REWRITES, export_rewrites
from .rewrites import fused_involution as rewrites_fused_involution
from .runtime import InputSpec

#: the package metadata entry that holds the input's :class:`InputSpec`
INPUT_SPEC_KEY = 'mmevo.input_spec'

#: the package metadata entry that says for what oneDNN laid out the
#: convolution weights at compile time (:attr:`AotiModel.weight_layout`)
WEIGHT_LAYOUT_KEY = 'mmevo.weight_layout'


class WeightLayoutWarning(UserWarning):
    """A package whose convolution weights oneDNN laid out at compile time
    is called on another thread count or size (:class:`AotiModel`)."""


#: the decompositions of ``inline_ops``: the ops' standard-operator
#: formulation (arguments resolved, as the operators take them)
INLINE_OPS = decompositions.DECOMPOSITIONS


def export_program(
    model,
    x,
    dynamic=True,
    inline_ops=False,
    triton_kernels=None,
    fused_involution=True,
):
    """``torch.export.export(model, (x, ))`` with H and W dynamic, under
    :func:`mmevo.deploy.export_rewrites` (with those of a package,
    :data:`mmevo.deploy.rewrites.AOTI_REWRITES`).

    Args:
        model (nn.Module): in eval mode; returns a tensor or a tuple of them.
        x (Tensor): the example input (B, C, H, W); B stays fixed.
        dynamic (bool): H and W dynamic. Default: True.
        inline_ops (bool): mmevo's operators decomposed into standard
            ones (:data:`INLINE_OPS`). Default: False.
        triton_kernels (bool, optional): mmevo's operators as their Triton
            ops (:data:`mmevo.ops.triton_ops.DECOMPOSITIONS`), whose kernels
            AOTInductor compiles into a CUDA package. Default (None): on
            CUDA, unless ``inline_ops``. On CPU, the program a CUDA package
            would compile (Inductor compiles Triton kernels for GPUs only).
        fused_involution (bool): on CPU, without ``inline_ops`` or
            ``triton_kernels``, each ``Involution``'s span convolution and
            aggregation as one ``mmevo::fused_involution``
            (:func:`mmevo.deploy.rewrites.fused_involution`), which reads
            Inductor's channels-last maps in place and never writes the
            kernel map: RedNet-50's package in 0.97-1.00x the stock
            graph's time (docs/deployment.md, Where the time goes).
            Default: True.

    Returns:
        torch.export.ExportedProgram: the program.

    Raises:
        ValueError: if both ``inline_ops`` and ``triton_kernels``.
        RuntimeError: naming the evolution layer (and its settings) that
            was running when the export failed.
    """
    if triton_kernels is None:
        triton_kernels = x.device.type == 'cuda' and not inline_ops
    if inline_ops and triton_kernels:
        raise ValueError(
            'inline_ops and triton_kernels exclude each other: the ops as '
            'standard operators, or as their Triton kernels'
        )
    rewrites = dict(AOTI_REWRITES)
    if (
        fused_involution
        and x.device.type == 'cpu'
        and not (inline_ops or triton_kernels)
    ):
        from mmevo.layers import Involution

        rewrites[Involution] = rewrites_fused_involution
    shapes = None
    if dynamic:
        dim = torch.export.Dim.DYNAMIC
        shapes = ({2: dim, 3: dim},)
    with (
        naming_failing_layer(model, 'torch.export'),
        torch.no_grad(),
        export_rewrites(model, rewrites),
    ):
        program = torch.export.export(
            model, (x,), dynamic_shapes=shapes, strict=False
        )
    if inline_ops:
        program = program.run_decompositions(INLINE_OPS)
    if triton_kernels:
        from mmevo.ops import triton_ops

        program = program.run_decompositions(triton_ops.DECOMPOSITIONS)
    return program


def export_aoti(
    model,
    x,
    path,
    dynamic=True,
    inline_ops=False,
    prepack=False,
    fused_involution=True,
):
    """Compile ``model`` into an AOTInductor package at ``path``, its
    weights frozen (constants of the program, batch norms folded).

    The package runs on the device of ``model`` and ``x`` (CPU or CUDA);
    on CUDA it holds mmevo's Triton kernels, autotuned at compile time.

    Args:
        model (nn.Module): in eval mode; returns a tensor or a tuple of them
            (e.g. a :class:`mmevo.deploy.TensorOutputs`).
        x (Tensor): the example input (B, C, H, W); B stays fixed.
        path (str): the ``.pt2`` file to write.
        dynamic (bool): H and W dynamic, so one package serves every size.
            Default: True.
        inline_ops (bool): the evolution ops as standard operators, for a
            runtime without mmevo's op library. Default: False.
        prepack (bool): with ``dynamic``, the convolution weights laid out
            for ``x``'s size on this process's thread count (see
            :func:`compile_program`; a ``ValueError`` without ``dynamic``).
            Default: False.
        fused_involution (bool): see :func:`export_program`. Default: True.

    Returns:
        str: ``path``.

    Example:
        >>> backbone = RedNet(50)
        >>> backbone.eval()  # mmdet's ResNet.train returns None
        >>> model = TensorOutputs(backbone, lambda m, x: m(x))
        >>> export_aoti(model, torch.randn(1, 3, 224, 224), 'rednet.pt2')
        >>> outputs = AotiModel('rednet.pt2')(torch.randn(1, 3, 160, 192))
    """
    program = export_program(
        model, x, dynamic, inline_ops, fused_involution=fused_involution
    )
    return compile_program(program, path, prepack=prepack)


class PrepackConvWeights(CustomGraphPass):
    """An Inductor graph pass: the frozen weight of every oneDNN convolution
    of a CPU graph with dynamic H and W, reordered once at compile time into
    the layout oneDNN picks for the example input size and this process's
    thread count: ``compile_program(..., prepack=True)`` (opt-in).

    Inductor's freezing prepacks convolution weights only for static input
    sizes; a dynamic package keeps them plain, and oneDNN reorders each one
    into its layout on every call (a fast copy: RedNet-50 at 224^2 with two
    threads, 50 against 44 ms prepacked). But oneDNN's layout of a weight
    changes with the input size and the thread count, and from a prepacked
    layout to another oneDNN reorders on a slow generic path: the
    prepacked RedNet-50 package took 217 and 257 ms at 256^2 and
    160 x 192, against 70 and 42 ms plain (docs/deployment.md, Weight
    layouts). The numbers are right at every size either way. Passed to
    the compile as Inductor's ``post_grad_custom_pre_pass`` (before the
    convolutions' fusions with their pointwise ops).
    """

    def __call__(self, graph):
        if not torch._C._has_mkldnn:  # no oneDNN convolutions to pack
            return
        gm = graph.owning_module
        conv = torch.ops.mkldnn._convolution_pointwise.default
        names = [a.name for a in conv._schema.arguments[:7]]
        if names != ['X', 'W', 'B', 'padding', 'stride', 'dilation', 'groups']:
            return  # another torch's oneDNN op: left as Inductor made it
        cache = {}
        for node in graph.find_nodes(op='call_function', target=conv):
            x, w = node.args[:2]
            if w.op != 'get_attr':
                continue
            weight = functools.reduce(getattr, w.target.split('.'), gm)
            val = x.meta.get('val')
            if weight.is_mkldnn or val is None or val.device.type != 'cpu':
                continue
            size = tuple(optimization_hint(s) for s in val.shape)
            window = (*tuple(tuple(a) for a in node.args[3:6]), node.args[6])
            key = (w.target, window, size)
            if key not in cache:
                cache[key] = f'_mmevo_prepacked_{len(cache)}'
                packed = torch.ops.mkldnn._reorder_convolution_weight(
                    weight, *window, list(size)
                )
                gm.register_buffer(cache[key], packed)
            with graph.inserting_before(node):
                new = graph.get_attr(cache[key])
            new.meta.update(w.meta)
            node.replace_input_with(w, new)
            if not w.users:
                graph.erase_node(w)

    def uuid(self):
        return get_hash_for_files((__file__,))


def compile_program(program, path, freeze=True, prepack=False):
    """AOTInductor's package of ``program`` at ``path``, its weights
    frozen (``torch._inductor.config.freezing``: constants of the
    program, batch norms folded into the convolutions).

    Freezes under :func:`freezing_keeps_shared_constants` (on torch 2.14,
    a two-stage detector's constants read by several nodes); where
    Inductor's freezing still fails, warns and compiles without freezing.
    The package records what its input is
    (:class:`mmevo.deploy.runtime.InputSpec`: the sizes, or a dynamic
    size's bounds, the dtype, the device), which :class:`AotiModel` checks
    every input against.

    oneDNN's convolution weights: with a static size, Inductor's freezing
    lays them out at compile time for that size on this process's thread
    count, so compile it with the threads it will run with (on others
    oneDNN re-lays each weight on every call on a slow generic path,
    docs/deployment.md, Weight layouts). With dynamic sizes they stay
    plain, for every size and thread count alike, unless ``prepack``.

    Args:
        program (torch.export.ExportedProgram): e.g. of
            :func:`export_program`.
        path (str): the ``.pt2`` file to write.
        freeze (bool): freeze the weights. Default: True.
        prepack (bool): with ``freeze`` and dynamic sizes, the weights laid
            out at compile time for the example's size on this process's
            thread count too (:class:`PrepackConvWeights`): 0.82-0.87x of
            the plain weights' time there, 3-10x at other sizes or thread
            counts. Default: False.

    Returns:
        str: ``path``.

    Raises:
        ValueError: ``prepack`` without ``freeze`` or for a program of
            static sizes.
    """
    specs = InputSpec.of_program(program)
    static = all(s.static for s in specs)
    if prepack and (not freeze or static):
        # a static program's weights are laid out by Inductor's freezing
        raise ValueError(
            'prepack applies to a frozen program with dynamic sizes, got '
            f'freeze={freeze} and {"static" if static else "dynamic"} sizes'
        )
    metadata = {INPUT_SPEC_KEY: json.dumps([s.to_dict() for s in specs])}
    if not freeze:
        return _compile(program, path, {'freezing': False}, metadata)
    configs = {'freezing': True}
    if prepack:
        configs['post_grad_custom_pre_pass'] = PrepackConvWeights()
    layout = _weight_layout(program, specs, prepack)
    frozen_metadata = dict(metadata)
    if layout is not None:
        frozen_metadata[WEIGHT_LAYOUT_KEY] = json.dumps(layout)
    frozen = copy.deepcopy(program)  # freezing edits the graph it folds
    try:
        # Inductor freezes only with gradients off: with them on, the
        # package silently keeps the weights as inputs of generic
        # convolutions (batch norms unfolded, no weight prepacking).
        with torch.no_grad(), freezing_keeps_shared_constants():
            return _compile(frozen, path, configs, frozen_metadata)
    except Exception as e:  # Inductor's own errors
        first = str(e).splitlines()[0] if str(e) else ''
        warnings.warn(
            f'AOTInductor freezing failed ({type(e).__name__}: {first}); '
            'compiling without it (slower)',
            stacklevel=2,
        )
    return _compile(program, path, {'freezing': False}, metadata)


#: the torch release :func:`freezing_keeps_shared_constants` was written for
FREEZING_FIX_WRITTEN_FOR = '2.14'


def _share_constant_reads(gm):
    """One ``get_attr`` node per attribute of ``gm``: the later reads of an
    attribute read the first's node instead."""
    first = {}
    for node in list(gm.graph.find_nodes(op='get_attr')):
        kept = first.setdefault(node.target, node)
        if kept is not node:
            node.replace_all_uses_with(kept)
            gm.graph.erase_node(node)


@contextlib.contextmanager
def freezing_keeps_shared_constants():
    """While it is open, Inductor's freezing keeps a constant that several
    nodes read (torch 2.14).

    Freezing's constant folding (``torch._inductor.freezing.constant_fold``)
    deletes the attribute of each ``get_attr`` node it leaves unused, even
    where another node reads the same attribute: a two-stage detector's
    anchor bases (``torch.tensor`` constants) are read three times, twice by
    metadata asserts, and the compile fails ("references nonexistent
    attribute"). Here each graph's reads of one attribute become one node
    before the folding. Applied on the torch release it was
    written for (:data:`FREEZING_FIX_WRITTEN_FOR`) only, and undone on
    exit; elsewhere :func:`compile_program` falls back to an unfrozen
    package with a warning, as before.

    Example:
        >>> with freezing_keeps_shared_constants():
        ...     pass
    """
    from torch._inductor import freezing

    fold = getattr(freezing, 'constant_fold', None)
    version = torch.__version__.split('+')[0]
    if fold is None or not version.startswith(FREEZING_FIX_WRITTEN_FOR + '.'):
        yield
        return

    def constant_fold(gm, *args, **kwargs):
        _share_constant_reads(gm)
        return fold(gm, *args, **kwargs)

    freezing.constant_fold = constant_fold
    try:
        yield
    finally:
        freezing.constant_fold = fold


_CONVOLUTIONS = (
    torch.ops.aten.conv2d.default,
    torch.ops.aten.convolution.default,
)


def _weight_layout(program, specs, prepack):
    """What a frozen CPU package's oneDNN convolution weights are laid out
    for at compile time: ``{'threads': n, 'size': [H, W] or None}`` (the
    example's size for a prepacked dynamic program; a static one has no
    other), or None where they stay plain (dynamic sizes without
    ``prepack``, no convolution, not the CPU)."""
    if not (
        torch._C._has_mkldnn
        and len(specs) == 1
        and specs[0].device == 'cpu'
        and (prepack or specs[0].static)
        and any(
            program.graph.find_nodes(op='call_function', target=conv)
            for conv in _CONVOLUTIONS
        )
    ):
        return None
    size = None
    if prepack:
        inputs = program.graph.find_nodes(op='placeholder')
        (x,) = (n for n in inputs if n.name == specs[0].name)
        size = [optimization_hint(s) for s in x.meta['val'].shape[-2:]]
    return {'threads': torch.get_num_threads(), 'size': size}


def _compile(program, path, configs, metadata):
    configs = dict(configs, **{'aot_inductor.metadata': metadata})
    return torch._inductor.aoti_compile_and_package(
        program, package_path=path, inductor_configs=configs
    )


class AotiModel:
    """An AOTInductor package loaded in this process, called like the
    PyTorch model it came from.

    mmevo's operators that the package calls are registered by the import
    of :mod:`mmevo.deploy` (the evolution ops and NMS / RoIAlign).

    Every input is checked against what the package recorded
    (:attr:`input_spec`, see :func:`compile_program`): a wrong rank,
    batch, dtype or device, another size than a static package's or one
    outside a dynamic package's bounds is a ``ValueError`` naming the
    expected and the given (the package itself would read out of bounds
    or return garbage). A non-contiguous or channels-last input is made
    contiguous, as the export saw it. A CPU package whose convolution
    weights oneDNN laid out at compile time (a static one, or a dynamic one
    with ``prepack``: :attr:`weight_layout`) warns, once, when called on
    another thread count or, prepacked, at another size: oneDNN may then
    re-lay every weight on every call, 3-10x the time.

    One call runs at a time: calls from several threads wait for each
    other (a lock), with the results of one thread. Without it two
    threads hang: the package's runner (one model) is entered holding the
    GIL, and the running call needs the GIL for mmevo's Python-registered
    operator kernels, while the second call holds it waiting for the
    model.

    Args:
        path (str): the ``.pt2`` file.
        name (str, optional): the package in messages; default:
            ``"AOTInductor package '<path>'"``.

    Example:
        >>> outputs = AotiModel('model.pt2')(torch.randn(1, 3, 64, 64))
    """

    def __init__(self, path, name=None):
        self.path = os.fspath(path)
        self.name = name or f"AOTInductor package '{self.path}'"
        self.runner = torch._inductor.aoti_load_package(self.path)
        recorded = self.runner.get_metadata().get(INPUT_SPEC_KEY)
        #: what a call takes (:class:`mmevo.deploy.runtime.InputSpec`);
        #: None for a package compiled without mmevo's record
        self.input_spec = None
        if recorded is not None:
            specs = [InputSpec.from_dict(d) for d in json.loads(recorded)]
            if len(specs) != 1:
                raise ValueError(
                    f'AotiModel runs packages of one input tensor, '
                    f"'{self.path}' takes {len(specs)}"
                )
            self.input_spec = specs[0]
        layout = self.runner.get_metadata().get(WEIGHT_LAYOUT_KEY)
        #: what oneDNN laid the convolution weights out for at compile time,
        #: ``{'threads': n, 'size': [H, W] or None}`` (the size of a
        #: prepacked dynamic package); None where they are plain
        self.weight_layout = None if layout is None else json.loads(layout)
        self._layout_warned = False
        self._lock = threading.Lock()

    def __call__(self, x):
        """Tuple of output tensors for the input ``x`` (a tensor).

        Raises:
            TypeError: ``x`` is no tensor.
            ValueError: ``x`` does not fit the package (:attr:`input_spec`).
        """
        if self.input_spec is not None:
            self.input_spec.check(x, self.name)
        elif not isinstance(x, torch.Tensor):
            raise TypeError(f'input must be a tensor, got {type(x).__name__}')
        if self.weight_layout is not None and not self._layout_warned:
            self._warn_of_relayouts(x)
        x = x.contiguous()
        with self._lock, torch.no_grad():
            return tuple(self.runner(x))

    def _warn_of_relayouts(self, x):
        """Warn, once, of a call on another thread count or size than the
        weights were laid out for."""
        threads, size = torch.get_num_threads(), list(x.shape[-2:])
        made = self.weight_layout
        if threads == made['threads'] and made['size'] in (None, size):
            return
        self._layout_warned = True
        laid_out = f'{made["threads"]} threads'
        called = f'{threads} threads'
        if made['size'] is not None:
            laid_out += ' and {}x{} inputs'.format(*made['size'])
            called += ' at {}x{}'.format(*size)
        warnings.warn(
            f'{self.name} has its convolution weights laid out for '
            f'{laid_out}; called on {called}, oneDNN may re-lay them on '
            'every call, on a slow path (ResNet-50 and RedNet-50: 3-10x '
            'the time). Compile the package on the thread count it runs '
            'with, or dynamic without prepack (docs/deployment.md, Weight '
            'layouts).',
            WeightLayoutWarning,
            stacklevel=3,
        )
