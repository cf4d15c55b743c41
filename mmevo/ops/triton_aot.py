"""Ahead-of-time compilation of the Triton kernels to GPU binaries, on any
machine (no GPU needed).

Compiles the kernel objects that run on CUDA (the autotuned functions of
:mod:`mmevo.ops.triton_backend`, each with its own ``configs``) to cubin
for every config, dtype and target, and reads the binary's resources:
registers, spilled bytes (``ptxas -v``), local and shared memory
(``cuobjdump --dump-resource-usage``). Triton is imported compiled, so this
runs in worker processes without ``TRITON_INTERPRET``, each with a fresh
Triton cache (every compile really compiles, and nothing is kept).

Example:
    >>> from mmevo.ops import triton_aot
    >>> rows = triton_aot.run(triton_aot.matrix(targets=[90]), processes=2)
    >>> [r for r in rows if r['error'] or r['spill_bytes']]
    []

Command line: ``python -m mmevo.ops.triton_aot [--targets 80 90]
[--processes 2]`` prints the rows as JSON.
"""

import argparse
import contextlib
import io
import json
import os
import re
import subprocess
import sys
import tempfile
import time

# Pointer element types of the kernels' three tensors per dtype; the
# correlation also writes fp32 logits from fp16 / bf16 inputs (softmax).
DTYPES = ('fp32', 'fp16', 'bf16', 'fp64')
CANDIDATE_TARGETS = (80, 90, 100)


def _tools():
    from triton import knobs

    return knobs


def _ptxas(cc):
    knobs = _tools()
    return (
        knobs.nvidia.ptxas_blackwell if cc >= 100 else knobs.nvidia.ptxas
    ).path


def targets():
    """The compute capabilities of :data:`CANDIDATE_TARGETS` that the
    installed Triton's ptxas can compile for."""
    found = []
    for cc in CANDIDATE_TARGETS:
        out = subprocess.run(
            [_ptxas(cc), '--help'], capture_output=True, text=True
        ).stdout
        if re.search(rf'\bsm_{cc}a?\b', out):
            found.append(cc)
    return found


def variants():
    """(kernel name, input dtype, output dtype) of every launch the ops
    make."""
    from .triton_kernels import KERNELS

    out = [(name, dt, dt) for name in KERNELS for dt in DTYPES]
    return out + [('correlate', dt, 'fp32') for dt in ('fp16', 'bf16')]


def matrix(targets_=None):
    """Every (kernel, in dtype, out dtype, config index, target) to
    compile: the configs the kernels autotune over on CUDA."""
    from .triton_kernels import GPU_CONFIGS

    ccs = targets() if targets_ is None else list(targets_)
    return [
        dict(kernel=k, dtype=dt, out_dtype=odt, config=i, target=cc)
        for k, dt, odt in variants()
        for i in range(len(GPU_CONFIGS))
        for cc in ccs
    ]


_DTYPE_NAMES = {
    'torch.float32': 'fp32',
    'torch.float16': 'fp16',
    'torch.bfloat16': 'bf16',
    'torch.float64': 'fp64',
}


def graph_jobs(graph_module, targets_=None):
    """Every (kernel, dtypes, column block, config, target) that the Triton
    kernel launches of a traced graph compile to: the kernels a CUDA
    AOTInductor package of that graph holds.

    Args:
        graph_module (torch.fx.GraphModule): a functional graph, as
            Inductor traces an exported program (mmevo's Triton ops
            decomposed into ``triton_kernel_wrapper_functional`` nodes).
        targets_ (list[int], optional): compute capabilities; default
            :func:`targets`.

    Returns:
        list[dict]: rows as :func:`matrix`'s, with ``block_w``; one per
        distinct launch and config.

    Raises:
        ValueError: if a node launches a kernel that is not mmevo's.
    """
    from torch._higher_order_ops.triton_kernel_wrap import (
        kernel_side_table,
        triton_kernel_wrapper_functional,
    )

    from .triton_kernels import GPU_CONFIGS, KERNELS

    # the tracer re-wraps the autotuner: known by the JITFunction
    names = {id(k.fn): name for name, k in KERNELS.items()}
    ccs = targets() if targets_ is None else list(targets_)
    jobs = []
    for node in graph_module.graph.find_nodes(
        op='call_function', target=triton_kernel_wrapper_functional
    ):
        kernel = kernel_side_table.get_kernel(node.kwargs['kernel_idx'])
        kernel = getattr(kernel, 'fn', kernel)
        if id(kernel) not in names:
            raise ValueError(f"{node.name} launches {kernel}, not mmevo's")
        args = dict(
            kernel_side_table.get_constant_args(
                node.kwargs['constant_args_idx']
            ),
            **node.kwargs['kwargs'],
        )
        ptrs = kernel.arg_names[:3]
        dtypes = [_DTYPE_NAMES[str(args[p].meta['val'].dtype)] for p in ptrs]
        for i in range(len(GPU_CONFIGS)):
            for cc in ccs:
                job = dict(
                    kernel=names[id(kernel)],
                    dtype=dtypes[0],
                    out_dtype=dtypes[2],
                    config=i,
                    target=cc,
                    block_w=args['BLOCK_W'],
                )
                if job not in jobs:
                    jobs.append(job)
    return jobs


def _source(job):
    """Triton's ASTSource of a job: the kernel's own JITFunction."""
    from triton.compiler import ASTSource

    from .triton_kernels import GPU_CONFIGS, KERNELS, MAX_BLOCK_W

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


def compile_job(job):
    """Compile one job; return it with its resources (or its error).

    Args:
        job (dict): a row of :func:`matrix`.

    Returns:
        dict: ``job`` plus ``config_str``, ``regs``, ``spill_bytes``
        (stores + loads), ``local``, ``shared``, ``seconds`` and ``error``
        (None, or the compiler's message).
    """
    import triton
    from triton.backends.compiler import GPUTarget

    src, options, config = _source(job)
    row = dict(job, config_str=str(config), error=None)
    knobs = _tools()
    log = io.StringIO()
    start = time.perf_counter()
    try:
        with knobs.nvidia.scope(), contextlib.redirect_stdout(log):
            knobs.nvidia.dump_ptxas_log = True
            compiled = triton.compile(
                src,
                target=GPUTarget('cuda', job['target'], 32),
                options=options,
            )
        res = _resources(compiled.asm['cubin'])
    except Exception as e:  # every compile error is a row of the report
        row['error'] = f'{type(e).__name__}: {e}'[:2000]
        return row
    spills = re.findall(r'(\d+) bytes spill (?:stores|loads)', log.getvalue())
    if not spills:
        row['error'] = 'no ptxas -v log: was the kernel compiled?'
    row.update(
        regs=res.get('REG'),
        spill_bytes=sum(map(int, spills)),
        local=res.get('LOCAL', 0) + res.get('STACK', 0),
        shared=compiled.metadata.shared,
        seconds=round(time.perf_counter() - start, 2),
    )
    return row


def run(jobs, processes=2, timeout=3600):
    """Compile ``jobs`` in ``processes`` worker processes.

    Workers import Triton without ``TRITON_INTERPRET`` (whatever this
    process has) and with a temporary cache of their own.

    Args:
        jobs (list[dict]): rows of :func:`matrix`.
        processes (int): worker processes. Default: 2.
        timeout (float): seconds for the whole run.

    Returns:
        list[dict]: :func:`compile_job`'s row for every job, in order.
    """
    if processes < 1:
        raise ValueError(f'processes must be >= 1, got {processes}')
    chunks = [jobs[i::processes] for i in range(processes)]
    env = {k: v for k, v in os.environ.items() if k != 'TRITON_INTERPRET'}
    repo = os.path.dirname(os.path.dirname(os.path.dirname(__file__)))
    env['PYTHONPATH'] = os.pathsep.join(
        p for p in (repo, env.get('PYTHONPATH')) if p
    )
    with tempfile.TemporaryDirectory() as cache:
        workers = []
        for n, chunk in enumerate(chunks):
            env_n = dict(env, TRITON_CACHE_DIR=os.path.join(cache, str(n)))
            proc = subprocess.Popen(
                [sys.executable, '-m', 'mmevo.ops.triton_aot', '--worker'],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=env_n,
                text=True,
            )
            workers.append(proc)
        outs = [
            p.communicate(json.dumps(c), timeout=timeout)
            for p, c in zip(workers, chunks)
        ]
    rows = {}
    for proc, (out, err) in zip(workers, outs):
        if proc.returncode:
            raise RuntimeError(f'AOT worker failed:\n{err[-4000:]}')
        for row in json.loads(out):
            rows[_key(row)] = row
    return [rows[_key(j)] for j in jobs]


def _key(job):
    return tuple(
        job.get(k)
        for k in (
            'kernel',
            'dtype',
            'out_dtype',
            'config',
            'target',
            'block_w',
        )
    )


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--targets', type=int, nargs='+')
    parser.add_argument('--processes', type=int, default=2)
    parser.add_argument(
        '--worker', action='store_true', help=argparse.SUPPRESS
    )
    args = parser.parse_args(argv)
    if args.worker:
        rows = [compile_job(job) for job in json.load(sys.stdin)]
    else:
        rows = run(matrix(args.targets), args.processes)
    json.dump(rows, sys.stdout)


if __name__ == '__main__':
    main()
