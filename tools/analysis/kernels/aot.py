"""Ahead-of-time compilation of the Triton kernels to GPU binaries, on any
machine (no GPU needed).

Compiles the kernel objects that run on CUDA (the autotuned functions of
:mod:`mmevo.ops.triton_backend`, each with its own ``configs``) to cubin
for every config, dtype and target, and reads the binary's resources:
registers, spilled bytes (``ptxas -v``), local and shared memory
(``cuobjdump --dump-resource-usage``). Triton is imported compiled, so this
runs in worker processes without ``TRITON_INTERPRET``, each with a fresh
Triton cache (every compile really compiles). With ``cache``, a compile
that Triton's own cache key says was done before (same kernel source,
config, target and toolchain) takes the row of that compile.

Example:
    >>> from tools.analysis.kernels import aot
    >>> rows = aot.run(aot.matrix(targets=[90]), processes=2)
    >>> [r for r in rows if r['error'] or r['spill_bytes']]
    []

Command line, from the repository root: ``python -m
tools.analysis.kernels.aot [--targets 80 90] [--processes 2] [--cache
[DIR]]`` prints the rows as JSON. One compile and its row:
:mod:`tools.analysis.kernels.cubin`.
"""

import argparse
import json
import os
import queue
import re
import subprocess
import sys
import tempfile
import threading
import time

from .cubin import compile_job, ptxas_path

# Pointer element types of the kernels' three tensors per dtype; the
# correlation also writes fp32 logits from fp16 / bf16 inputs (softmax).
DTYPES = ('fp32', 'fp16', 'bf16', 'fp64')
CANDIDATE_TARGETS = (80, 90, 100)
# Rows kept across runs (``--cache``), beside setup_env.sh's mmcv wheel.
CACHE = os.path.join(
    os.environ.get('MMEVO_CACHE', os.path.expanduser('~/.cache/mmevo')),
    'triton-aot',
)


def targets():
    """The compute capabilities of :data:`CANDIDATE_TARGETS` that the
    installed Triton's ptxas can compile for."""
    found = []
    for cc in CANDIDATE_TARGETS:
        out = subprocess.run(
            [ptxas_path(cc), '--help'], capture_output=True, text=True
        ).stdout
        if re.search(rf'\bsm_{cc}a?\b', out):
            found.append(cc)
    return found


def variants():
    """(kernel name, input dtype, output dtype) of every launch the ops
    make."""
    from mmevo.ops.triton_kernels import KERNELS

    out = [(name, dt, dt) for name in KERNELS for dt in DTYPES]
    return out + [('correlate', dt, 'fp32') for dt in ('fp16', 'bf16')]


def matrix(targets_=None):
    """Every (kernel, in dtype, out dtype, config index, target) to
    compile: the configs the kernels autotune over on CUDA, then those of
    the fused involution's kernels (:func:`fused_matrix`)."""
    from mmevo.ops.triton_kernels import GPU_CONFIGS

    ccs = targets() if targets_ is None else list(targets_)
    return (
        [
            dict(kernel=k, dtype=dt, out_dtype=odt, config=i, target=cc)
            for k, dt, odt in variants()
            for i in range(len(GPU_CONFIGS))
            for cc in ccs
        ]
        + fused_matrix(ccs)
        + attention_matrix(ccs)
    )


# The dtypes the fused kernels (involution, local attention) compile in:
# those models train in, and fp64 (the float64 tests').
FUSED_DTYPES = ('fp32', 'fp16', 'bf16', 'fp64')


def fused_matrix(ccs):
    """The compiles of :mod:`mmevo.ops.triton_fused`'s kernels (kernel
    ``'fused_<name>'``, its ``aot_jobs`` rows) for targets ``ccs``."""
    from mmevo.ops.triton_fused import aot_jobs

    return [
        dict(job, kernel='fused_' + job['kernel'], target=cc)
        for job in aot_jobs(FUSED_DTYPES)
        for cc in ccs
    ]


def attention_matrix(ccs):
    """The compiles of :mod:`mmevo.ops.triton_fused_attention`'s kernels
    (kernel ``'attn_<name>'``, its ``aot_jobs`` rows, in the dtypes of
    :data:`FUSED_DTYPES`) for targets ``ccs``."""
    from mmevo.ops.triton_fused_attention import aot_jobs

    return [
        dict(job, kernel='attn_' + job['kernel'], target=cc)
        for job in aot_jobs(FUSED_DTYPES)
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

    from mmevo.ops.triton_kernels import GPU_CONFIGS, KERNELS

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


def run(jobs, processes=2, timeout=3600, cache=None):
    """Compile ``jobs`` in ``processes`` worker processes.

    Workers import Triton without ``TRITON_INTERPRET`` (whatever this
    process has) and with a temporary Triton cache of their own; each
    takes the next job as it finishes one, so a slow compile holds up
    one worker only.

    Args:
        jobs (list[dict]): rows of :func:`matrix`.
        processes (int): worker processes. Default: 2.
        timeout (float): seconds for the whole run.
        cache (str, optional): a folder of rows kept across runs (see
            :func:`compile_job`), e.g. :data:`CACHE`. Default: compile
            every job.

    Returns:
        list[dict]: :func:`compile_job`'s row for every job, in order.

    Raises:
        ValueError: if ``processes`` < 1.
        RuntimeError: if a worker fails, or the run takes longer than
            ``timeout``.
    """
    if processes < 1:
        raise ValueError(f'processes must be >= 1, got {processes}')
    env = {k: v for k, v in os.environ.items() if k != 'TRITON_INTERPRET'}
    repo = os.path.dirname(
        os.path.dirname(os.path.dirname(os.path.dirname(__file__)))
    )
    env['PYTHONPATH'] = os.pathsep.join(
        p for p in (repo, env.get('PYTHONPATH')) if p
    )
    command = [sys.executable, '-m', 'tools.analysis.kernels.aot', '--worker']
    if cache:
        command += ['--cache', os.path.abspath(cache)]
    todo = queue.SimpleQueue()
    for item in enumerate(jobs):
        todo.put(item)
    rows = [None] * len(jobs)

    def serve(proc):
        # one job at a time to each worker: the next when its row is back
        while True:
            try:
                i, job = todo.get_nowait()
            except queue.Empty:
                break
            proc.stdin.write(json.dumps(job) + '\n')
            proc.stdin.flush()
            line = proc.stdout.readline()
            if not line:
                break
            rows[i] = json.loads(line)
        proc.stdin.close()

    with tempfile.TemporaryDirectory() as tmp:
        workers = []
        for n in range(min(processes, len(jobs))):
            stderr = open(os.path.join(tmp, f'{n}.err'), 'w+')
            proc = subprocess.Popen(
                command,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=stderr,
                env=dict(env, TRITON_CACHE_DIR=os.path.join(tmp, str(n))),
                text=True,
            )
            thread = threading.Thread(target=serve, args=(proc,))
            thread.start()
            workers.append((proc, thread, stderr))
        deadline = time.monotonic() + timeout
        failures = []
        for proc, thread, stderr in workers:
            thread.join(max(0, deadline - time.monotonic()))
            if thread.is_alive():
                for p, _, _ in workers:
                    p.kill()
                raise RuntimeError(f'AOT compiles took over {timeout} s')
            if proc.wait():
                stderr.seek(0)
                failures.append(stderr.read()[-4000:])
            stderr.close()
    if failures:
        raise RuntimeError('AOT worker failed:\n' + failures[0])
    return rows


def _worker(cache):
    """Compile the jobs read from stdin, one JSON line each, and write
    each row as one line to stdout (anything else printed goes to
    stderr)."""
    out = os.fdopen(os.dup(1), 'w')
    os.dup2(2, 1)
    for line in sys.stdin:
        out.write(json.dumps(compile_job(json.loads(line), cache)) + '\n')
        out.flush()


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--targets', type=int, nargs='+')
    parser.add_argument('--processes', type=int, default=2)
    parser.add_argument(
        '--cache',
        nargs='?',
        const=CACHE,
        help=f'reuse the rows of earlier compiles (default folder {CACHE})',
    )
    parser.add_argument(
        '--worker', action='store_true', help=argparse.SUPPRESS
    )
    args = parser.parse_args(argv)
    if args.worker:
        _worker(args.cache)
        return
    rows = run(matrix(args.targets), args.processes, cache=args.cache)
    json.dump(rows, sys.stdout)


if __name__ == '__main__':
    main()
