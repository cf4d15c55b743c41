"""What the benchmark tools measure (``tools/analysis/benchmark_*.py``):
steps timed round-robin in one process, their peak tensor memory, the
train step of a backbone and its most expensive ops.

Example:
    >>> times = time_steps({'a': model_a, 'b': model_b}, x, 1, 5)
    >>> ratio = times['b'] / times['a']
"""

import os.path as osp
import statistics
import time

import torch
from torch.profiler import ProfilerActivity, profile

from mmevo.ops import cpp_backend


def sync(device):
    """Wait for the work queued on ``device`` (CUDA runs asynchronously)."""
    if device.type == 'cuda':
        torch.cuda.synchronize(device)


def median_times(steps, device, warmup, iters, clock=time.perf_counter):
    """Median time (s) on ``clock`` of each of ``steps`` (a dict of
    callables), over ``iters`` rounds after ``warmup`` rounds.

    A round runs every step once, in turn, so that all of them see the same
    allocator and cache state (on CPU, whether freshly allocated memory
    must be page-faulted in changes a step's time by up to 3x) and a load
    change on a shared machine hits them alike.
    """
    times = {name: [] for name in steps}
    for it in range(warmup + iters):
        for name, step in steps.items():
            sync(device)
            start = clock()
            step()
            sync(device)
            if it >= warmup:
                times[name].append(clock() - start)
    return {name: statistics.median(t) for name, t in times.items()}


def peak_bytes(step, device):
    """Peak tensor bytes allocated during one ``step()`` above the level
    before it: on CUDA ``max_memory_allocated``; on CPU the allocation and
    free records of the PyTorch profiler, replayed in time order. A tensor
    held before the step and freed in it (a previous step's gradients)
    lowers the level, so callers free those first."""
    if device.type == 'cuda':
        sync(device)
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
        step()
        sync(device)
        return torch.cuda.max_memory_allocated(device) - base
    with profile(
        activities=[ProfilerActivity.CPU], profile_memory=True
    ) as prof:
        step()
    events = sorted(
        (e.start_ns(), e.nbytes())
        for e in prof.profiler.kineto_results.events()
        if e.name() == '[memory]'
    )
    current = peak = 0
    for _, nbytes in events:
        current += nbytes
        peak = max(peak, current)
    return peak


def train_step(model, x):
    """Forward and backward of one batch; gradients are dropped first."""
    model.zero_grad(set_to_none=True)
    outs = model(x)
    sum(o.mean() for o in outs).backward()


def time_steps(models, x, warmup, iters):
    """Median wall time (s) of a train step of each model, interleaved."""
    steps = {name: lambda m=m: train_step(m, x) for name, m in models.items()}
    return median_times(steps, x.device, warmup, iters)


def peak_memory(model, x):
    """Peak bytes allocated during one train step, above the start."""
    model.zero_grad(set_to_none=True)
    return peak_bytes(lambda: train_step(model, x), x.device)


def op_profile(model, x, rows):
    """Table of the ops taking the most CPU time in one train step."""
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        train_step(model, x)
    return prof.key_averages().table(
        sort_by='self_cpu_time_total', row_limit=rows
    )


def ops_backend():
    """Say which implementation backs ``mmevo.ops`` in this process."""
    if cpp_backend.LIBRARY is None:
        return 'no compiled extension found (pure-PyTorch fallback)'
    return 'C++ extension ' + osp.basename(cpp_backend.LIBRARY)
