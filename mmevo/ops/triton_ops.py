"""The evolution ops as ``torch.library.triton_op`` s, for AOTInductor
packages that run on CUDA without Python: ``mmevo::triton_aggregate``,
``mmevo::triton_correlation`` and ``mmevo::triton_attention_weights``
(the schemas of ``evolution_aggregate``, ``local_correlation`` and
``local_attention_weights``, :mod:`mmevo.ops.library`).

A ``torch.ops.mmevo.*`` op is opaque to Inductor, and its CUDA kernel is
registered from Python: a package calling it runs from Python only. The
body of a ``triton_op`` is visible to Inductor instead. Each one is the
operator's own Python path (:data:`mmevo.ops.dispatch.PATHS`) on the Triton
backend (reflect padding made
explicit, empty batches answered, the softmax after the kernel), whose
launches of :mod:`mmevo.ops.triton_kernels` are recorded as graph nodes
when traced (:func:`mmevo.ops.triton_backend.launcher`). AOTInductor then
autotunes those kernels over their configs and compiles them into the
package. Called eagerly, the ops run the Triton backend.

:data:`DECOMPOSITIONS` maps the library's ops to these, for
``ExportedProgram.run_decompositions``
(:func:`mmevo.deploy.aoti.export_program` on CUDA). Importing this module
defines the three operators.

``triton_op`` finds a body's kernels by reading its source, for the key of
AOTAutograd's cache; these bodies launch them two calls deep, so it finds
none. AOTInductor does not use that cache (it traces with
``aot_export_module``), and Inductor's FX graph cache hashes the source of
the kernels the trace launches, so a changed kernel is recompiled.
"""

import functools

import torch

from . import backends, dispatch, library


def _define(name, schema, check, fn):
    """``mmevo::<name>``: ``check`` the arguments, then ``fn`` on the
    Triton backend."""

    @functools.wraps(fn)
    def run(*args):
        check(*args)
        with backends.use_backend('triton'):
            return fn(*args)

    torch.library.triton_op(
        f'mmevo::{name}', run, mutates_args=(), schema=schema
    )
    return getattr(torch.ops.mmevo, name).default


_aggregate, _correlation, _attention_weights = (
    _define(
        name,
        library.SCHEMAS[op],
        dispatch.CHECKS[op],
        dispatch.PATHS[op],
    )
    for name, op in (
        ('triton_aggregate', 'evolution_aggregate'),
        ('triton_correlation', 'local_correlation'),
        ('triton_attention_weights', 'local_attention_weights'),
    )
)

#: ``run_decompositions`` table: the library's ops to their Triton ops
DECOMPOSITIONS = {
    torch.ops.mmevo.evolution_aggregate.default: _aggregate,
    torch.ops.mmevo.local_correlation.default: _correlation,
    torch.ops.mmevo.local_attention_weights.default: _attention_weights,
}
