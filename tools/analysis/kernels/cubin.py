"""One ahead-of-time compile of a Triton kernel of mmevo to cubin, and the
binary's resources: a row of :mod:`tools.analysis.kernels.aot`.

A row's cache file is named by Triton's own cache key and by this module's
source (how the row is measured), so a change here compiles again.
"""

import contextlib
import hashlib
import io
import json
import os
import re
import subprocess
import tempfile
import time


def _tools():
    from triton import knobs

    return knobs


def ptxas_path(cc):
    """The ptxas that compiles for compute capability ``cc``."""
    knobs = _tools()
    return (
        knobs.nvidia.ptxas_blackwell if cc >= 100 else knobs.nvidia.ptxas
    ).path


def _source(job):
    """Triton's ASTSource of a job: the kernel's own JITFunction."""
    from triton.compiler import ASTSource

    if job['kernel'].startswith('attn_'):
        from mmevo.ops import triton_fused_attention

        name = job['kernel'][len('attn_') :]
        src, options = triton_fused_attention.aot_source(
            name, job['dtype'], job['config'], block_d=job['block_d']
        )
        return src, options, triton_fused_attention.GPU_CONFIGS[job['config']]
    if job['kernel'].startswith('fused_'):
        from mmevo.ops import triton_fused

        name = job['kernel'][len('fused_') :]
        src, options = triton_fused.aot_source(
            name, job['dtype'], job['config'], block_r=job['block_r']
        )
        return src, options, triton_fused.GPU_CONFIGS[name][job['config']]
    from mmevo.ops.triton_kernels import GPU_CONFIGS, KERNELS, MAX_BLOCK_W

    kernel = KERNELS[job['kernel']]
    if kernel.configs is not GPU_CONFIGS:
        raise RuntimeError('AOT compiles need TRITON_INTERPRET unset')
    config = kernel.configs[job['config']]
    fn = kernel.fn
    ptrs = fn.arg_names[:3]
    consts = dict(
        IS_FP64=job['dtype'] == 'fp64',
        BLOCK_W=job.get('block_w', MAX_BLOCK_W),
        **config.kwargs,
    )
    sig = {
        name: ('constexpr' if name in consts else 'i32')
        for name in fn.arg_names
    }
    sig.update({p: f'*{job["dtype"]}' for p in ptrs[:2]})
    sig[ptrs[2]] = f'*{job["out_dtype"]}'
    options = dict(
        num_warps=config.num_warps,
        num_stages=config.num_stages,
        num_ctas=config.num_ctas,
    )
    if config.maxnreg is not None:
        options['maxnreg'] = config.maxnreg
    return ASTSource(fn, sig, consts), options, config


def _resources(cubin):
    """{'REG', 'SHARED', 'LOCAL', 'STACK'} of a cubin, from cuobjdump."""
    with tempfile.NamedTemporaryFile(suffix='.cubin') as f:
        f.write(cubin)
        f.flush()
        out = subprocess.run(
            [_tools().nvidia.cuobjdump.path, '--dump-resource-usage', f.name],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    return {
        k: int(v)
        for k, v in re.findall(r'\b(REG|SHARED|LOCAL|STACK):(\d+)', out)
    }


def _cache_path(cache, src, options, target):
    """The file of a compile's row in ``cache``: named by Triton's own
    cache key (the triton build, the kernel's source and its callees',
    signature, constants, options, ptxas version and target) and by this
    module's source (how the row is measured)."""
    from triton._C.libtriton import get_cache_invalidating_env_vars
    from triton.compiler.compiler import make_backend
    from triton.runtime.cache import get_cache_key

    backend = make_backend(target)
    parsed = backend.parse_options(dict(options, **src.parse_options()))
    key = get_cache_key(
        src, backend, parsed, get_cache_invalidating_env_vars()
    )
    with open(__file__, 'rb') as f:
        key += hashlib.sha256(f.read()).hexdigest()
    return os.path.join(cache, hashlib.sha256(key.encode()).hexdigest())


def compile_job(job, cache=None):
    """Compile one job; return it with its resources (or its error).

    Args:
        job (dict): a row of :func:`tools.analysis.kernels.aot.matrix`.
        cache (str, optional): a folder of earlier rows: a job whose
            compile Triton would take from its own cache (same source,
            config, target and toolchain) gets the row of that compile
            instead of compiling again; a new successful row is stored.

    Returns:
        dict: ``job`` plus ``config_str``, ``regs``, ``spill_bytes``
        (stores + loads), ``local``, ``shared``, ``seconds``, ``cached``
        (whether the row came from ``cache``) and ``error`` (None, or the
        compiler's message).
    """
    import triton
    from triton.backends.compiler import GPUTarget

    src, options, config = _source(job)
    row = dict(job, config_str=str(config), error=None, cached=False)
    target = GPUTarget('cuda', job['target'], 32)
    path = cache and _cache_path(cache, src, options, target)
    if path and os.path.exists(path):
        with open(path) as f:
            return dict(row, **json.load(f), cached=True)
    knobs = _tools()
    log = io.StringIO()
    start = time.perf_counter()
    try:
        with knobs.nvidia.scope(), contextlib.redirect_stdout(log):
            knobs.nvidia.dump_ptxas_log = True
            compiled = triton.compile(src, target=target, options=options)
        res = _resources(compiled.asm['cubin'])
    except Exception as e:  # every compile error is a row of the report
        row['error'] = f'{type(e).__name__}: {e}'[:2000]
        return row
    spills = re.findall(r'(\d+) bytes spill (?:stores|loads)', log.getvalue())
    if not spills:
        row['error'] = 'no ptxas -v log: was the kernel compiled?'
    measured = dict(
        regs=res.get('REG'),
        spill_bytes=sum(map(int, spills)),
        local=res.get('LOCAL', 0) + res.get('STACK', 0),
        shared=compiled.metadata.shared,
        seconds=round(time.perf_counter() - start, 2),
    )
    row.update(measured)
    if path and row['error'] is None:
        os.makedirs(cache, exist_ok=True)
        # written whole, then renamed: a reader never sees half a row
        with tempfile.NamedTemporaryFile(
            'w', dir=cache, delete=False, suffix='.tmp'
        ) as f:
            json.dump(measured, f)
        os.replace(f.name, path)
    return row
