"""GPU check of mmevo: the suite's ``cuda`` tests on the GPU, then timings.

Run it through ``tools/analysis/gpu_check.sh``, which sets up a bare CUDA
machine first. Two steps:

* ``pytest -m cuda`` on the test files that hold ``cuda`` tests (the Triton
  kernels and layers against float64 references, second derivatives,
  bit-identical reruns, > 2**31 elements, bf16 autocast, torch.compile);
  in parallel processes (pytest-xdist) where it is installed, since
  compiling the kernel variants is their cost;
* on CUDA, the ``benchmark_*`` scripts: the aggregation at the RedNet-50
  stage shapes against ``unfold`` and shift-and-add (fp32, bf16), the
  fused involution op's Triton kernels against the unfused composition
  (and the default of ``MMEVO_FUSED_TRITON`` that supports), the fused
  local attention's Triton kernels against the stock ops
  (``benchmark_ops.py --attention``), and RedNet-50 against ResNet-50
  train steps.

Without CUDA the tests run on CPU tensors under ``TRITON_INTERPRET=1``,
small, and the CUDA-only tests and the timings are skipped (CI). Writes
``gpu_check.json`` and ``gpu_check.md`` into ``$OUT`` if set, else
``--out``; exits 1 if a test fails, none ran, or (on CUDA) one was skipped,
or a benchmark failed. Arguments after ``--`` go to pytest.

Example:
    bash tools/analysis/gpu_check.sh                    # on the GPU
    bash tools/analysis/gpu_check.sh --no-benchmarks -- -k sweep
"""

import argparse
import glob
import json
import os
import os.path as osp
import platform
import re
import subprocess
import sys
import time
import xml.etree.ElementTree as ET

import torch

REPO = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))


def benchmarks():
    """(name, arguments[, environment]) of each timing, run from the
    repository root; the environment adds to this process's."""
    return [
        (
            'aggregation fp32',
            [
                'tools/analysis/benchmark_ops.py',
                '--device',
                'cuda',
                '--dtype',
                'float32',
            ],
        ),
        (
            'aggregation bf16',
            [
                'tools/analysis/benchmark_ops.py',
                '--device',
                'cuda',
                '--dtype',
                'bfloat16',
            ],
        ),
        (
            'fused involution op',
            ['tools/analysis/benchmark_fused_op.py', '--device', 'cuda'],
        ),
        (
            'fused local attention',
            [
                'tools/analysis/benchmark_ops.py',
                '--attention',
                '--device',
                'cuda',
            ],
            {'MMEVO_FUSED_TRITON': '1'},
        ),
        (
            'train step',
            [
                'tools/analysis/benchmark_backbones.py',
                '--device',
                'cuda',
                '--batch',
                '32',
                '--iters',
                '5',
                '--models',
                'resnet50',
                'rednet50',
                '--builder',
                backbone_builder(),
            ],
        ),
    ]


def backbone_builder():
    """mmdet's ResNet and mmevo's RedNet where mmdet's models import (they
    need mmcv's compiled ops, which a bare CUDA machine lacks), else
    torchvision's ResNet."""
    try:
        import mmdet.models  # noqa: F401
    except ImportError:
        return 'torchvision'
    return 'mmdet'


def cuda_test_files(root):
    """The test files that hold ``cuda`` tests: collecting only those keeps
    the check off the modules that need mmdet or onnx."""
    pattern = re.compile(r'pytest\.mark\.cuda\b')
    files = []
    for path in sorted(
        glob.glob(osp.join(root, 'tests', '**', 'test_*.py'), recursive=True)
    ):
        with open(path) as f:
            if pattern.search(f.read()):
                files.append(osp.relpath(path, root))
    return files


def read_junit(path):
    """One dict per test case of pytest's JUnit XML: id, outcome, seconds,
    message."""
    tests = []
    for case in ET.parse(path).getroot().iter('testcase'):
        outcome, message = 'passed', ''
        for tag in ('failure', 'error', 'skipped'):
            node = case.find(tag)
            if node is not None:
                outcome = {'failure': 'failed'}.get(tag, tag)
                message = node.get('message') or ''
                break
        name = case.get('classname', '').replace('.', '/') + '.py::'
        tests.append(
            dict(
                id=name + case.get('name', ''),
                outcome=outcome,
                seconds=float(case.get('time') or 0),
                message=message[:2000],
            )
        )
    return tests


def run_tests(files, out_dir, workers, pytest_args):
    """``pytest -m cuda`` on ``files``: (test records, pytest's exit
    status, seconds)."""
    junit = osp.join(out_dir, 'junit.xml')
    cmd = [
        sys.executable,
        '-m',
        'pytest',
        '-m',
        'cuda',
        '-q',
        '-rfEs',
        '-p',
        'no:cacheprovider',
        '-c',
        osp.join(REPO, 'pyproject.toml'),
        '--rootdir',
        REPO,
        f'--junitxml={junit}',
    ]
    if workers > 1:
        cmd += ['-n', str(workers)]
    print('gpu_check: ' + ' '.join(cmd[1:] + files + pytest_args), flush=True)
    start = time.perf_counter()
    status = subprocess.call(cmd + files + pytest_args, cwd=REPO)
    seconds = time.perf_counter() - start
    tests = read_junit(junit) if osp.exists(junit) else []
    return tests, status, seconds


def run_benchmarks(repeat):
    """Each of :func:`benchmarks`: its printed tables, status and time."""
    results = []
    for name, args, *env in benchmarks():
        cmd = (
            [sys.executable]
            + args
            + (['--repeat', str(repeat)] if 'benchmark_ops' in args[0] else [])
        )
        print(f'gpu_check: {name}: ' + ' '.join(cmd[1:]), flush=True)
        start = time.perf_counter()
        proc = subprocess.run(
            cmd,
            cwd=REPO,
            env={**os.environ, **env[0]} if env else None,
            capture_output=True,
            text=True,
            timeout=900,
        )
        print(proc.stdout + proc.stderr[-4000:], flush=True)
        results.append(
            dict(
                name=name,
                command=' '.join(args),
                returncode=proc.returncode,
                seconds=time.perf_counter() - start,
                output=proc.stdout,
                stderr=proc.stderr[-4000:],
            )
        )
    return results


def verdict(tests, status, benchmarks, cuda):
    """The reasons the check fails (an empty list: it passed)."""
    reasons = [
        f'{t["outcome"]}: {t["id"]}'
        for t in tests
        if t['outcome'] in ('failed', 'error')
    ]
    if not any(t['outcome'] == 'passed' for t in tests):
        reasons.append('no test passed')
    if cuda:  # on a GPU every cuda test runs
        reasons += [
            f'skipped on CUDA: {t["id"]} ({t["message"]})'
            for t in tests
            if t['outcome'] == 'skipped'
        ]
    if status not in (0, 1) or (status == 1 and not reasons):
        reasons.append(f'pytest exited with status {status}')
    reasons += [
        f'benchmark failed: {b["name"]} (status {b["returncode"]})'
        for b in benchmarks
        if b['returncode']
    ]
    return reasons


def write_outputs(out_dir, result):
    with open(osp.join(out_dir, 'gpu_check.json'), 'w') as f:
        json.dump(result, f, indent=1)
    meta = result['meta']
    count = {}
    by_file = {}
    for t in result['tests']:
        count[t['outcome']] = count.get(t['outcome'], 0) + 1
        row = by_file.setdefault(t['id'].split('::')[0], {})
        row[t['outcome']] = row.get(t['outcome'], 0) + 1
        row['seconds'] = row.get('seconds', 0.0) + t['seconds']
    lines = [
        f'# GPU check: {"PASSED" if result["passed"] else "FAILED"}',
        '',
        ', '.join(f'{k}: {v}' for k, v in meta.items()),
        '',
        '`pytest -m cuda`: '
        + ', '.join(f'{n} {k}' for k, n in sorted(count.items()))
        + f' in {result["pytest_seconds"]:.0f} s',
        '',
        '| test file | passed | failed | skipped | s |',
        '|---|---|---|---|---|',
    ]
    for name, row in by_file.items():
        lines.append(
            f'| {name} | {row.get("passed", 0)} | '
            f'{row.get("failed", 0) + row.get("error", 0)} | '
            f'{row.get("skipped", 0)} | {row["seconds"]:.0f} |'
        )
    if result['reasons']:
        lines += ['', 'Failures:', ''] + [f'* {r}' for r in result['reasons']]
    if not result['benchmarks']:
        lines += ['', 'Timings: not run (needs CUDA).']
    for b in result['benchmarks']:
        lines += [
            '',
            f'## {b["name"]}',
            '',
            f'`python {b["command"]}` ({b["seconds"]:.0f} s)',
            '',
            b['output'].rstrip(),
        ]
    with open(osp.join(out_dir, 'gpu_check.md'), 'w') as f:
        f.write('\n'.join(lines) + '\n')


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument(
        '--out',
        default='work_dirs/gpu_check',
        help='output folder ($OUT wins when set)',
    )
    parser.add_argument(
        '--tests',
        nargs='+',
        default=None,
        help='test files or folders (default: those holding cuda tests)',
    )
    parser.add_argument(
        '--workers',
        type=int,
        default=None,
        help='pytest-xdist processes (default 8 on CUDA when installed, '
        'else 1)',
    )
    parser.add_argument(
        '--no-benchmarks', action='store_true', help='tests only'
    )
    parser.add_argument('--repeat', type=int, default=10)
    parser.add_argument('pytest_args', nargs='*', help='after --: to pytest')
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    cuda = torch.cuda.is_available()
    if not cuda and os.environ.get('TRITON_INTERPRET') != '1':
        raise SystemExit(
            'no CUDA device: run with TRITON_INTERPRET=1 (CPU '
            'tensors through the Triton interpreter)'
        )
    import triton

    meta = dict(
        device_kind='cuda' if cuda else 'cpu (TRITON_INTERPRET=1)',
        device=torch.cuda.get_device_name() if cuda else platform.machine(),
        torch=torch.__version__,
        triton=triton.__version__,
        python=platform.python_version(),
    )
    print(
        'gpu_check: ' + ', '.join(f'{k}={v}' for k, v in meta.items()),
        flush=True,
    )
    out_dir = os.environ.get('OUT') or args.out
    os.makedirs(out_dir, exist_ok=True)
    workers = args.workers
    if workers is None:
        try:
            import xdist  # noqa: F401

            workers = min(8, os.cpu_count() or 1) if cuda else 1
        except ImportError:
            workers = 1
    files = args.tests or cuda_test_files(REPO)
    tests, status, seconds = run_tests(
        files, out_dir, workers, args.pytest_args
    )
    benchmarks = (
        [] if args.no_benchmarks or not cuda else run_benchmarks(args.repeat)
    )
    reasons = verdict(tests, status, benchmarks, cuda)
    result = dict(
        meta=meta,
        passed=not reasons,
        reasons=reasons,
        pytest_status=status,
        pytest_seconds=seconds,
        tests=tests,
        benchmarks=benchmarks,
    )
    write_outputs(out_dir, result)
    print(
        f'{"PASSED" if not reasons else "FAILED"}: {len(tests)} tests, '
        f'{len(reasons)} problems; {osp.join(out_dir, "gpu_check.md")}',
        flush=True,
    )
    return 1 if reasons else 0


if __name__ == '__main__':
    sys.exit(main())
