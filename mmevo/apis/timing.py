"""What the benchmark tools measure (``tools/analysis/benchmark_*.py``): the
train step of backbones, interleaved in one process, its peak memory and
its most expensive ops.

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


def train_step(model, x):
    """Forward and backward of one batch; gradients are dropped first."""
    model.zero_grad(set_to_none=True)
    outs = model(x)
    sum(o.mean() for o in outs).backward()


def sync(x):
    if x.is_cuda:
        torch.cuda.synchronize(x.device)


def time_steps(models, x, warmup, iters):
    """Median wall time (s) of a train step of each model, interleaved."""
    times = {name: [] for name in models}
    for it in range(warmup + iters):
        for name, model in models.items():
            sync(x)
            start = time.perf_counter()
            train_step(model, x)
            sync(x)
            if it >= warmup:
                times[name].append(time.perf_counter() - start)
    return {name: statistics.median(t) for name, t in times.items()}


def peak_memory(model, x):
    """Peak bytes allocated during one train step, above the start."""
    model.zero_grad(set_to_none=True)
    if x.is_cuda:
        sync(x)
        torch.cuda.reset_peak_memory_stats(x.device)
        base = torch.cuda.memory_allocated(x.device)
        train_step(model, x)
        sync(x)
        return torch.cuda.max_memory_allocated(x.device) - base
    with profile(
        activities=[ProfilerActivity.CPU], profile_memory=True
    ) as prof:
        train_step(model, x)
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
