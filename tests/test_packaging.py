"""The sdist builds, installs into a fresh venv and works there.

``python -m build --sdist`` of the working tree (its tracked and
not-ignored files, copied out so nothing is written into the checkout),
then ``pip install`` of the tarball into a new venv, which compiles the C++
extension from the sdist alone; then, from outside the repository, mmevo
imports from that venv and runs an op on the C++ kernels. The venv sees the
running interpreter's packages through a ``.pth`` line (torch is not
reinstalled; its ``.pth`` files, this checkout's editable mmevo among them,
are not run), and pip installs with ``--no-build-isolation --no-deps``:
nothing is downloaded.
"""

import glob
import os
import os.path as osp
import shutil
import site
import subprocess
import sys
import sysconfig
import tarfile

import pytest

import mmevo

pytestmark = pytest.mark.slow

REPO = osp.dirname(osp.dirname(osp.abspath(__file__)))
RUN_AN_OP = """
import sys
import torch
import mmevo
from mmevo.ops import cpp_backend, evolution_aggregate
from mmevo.ops.library import use_backend
from mmevo.ops.checks import Window
from mmevo.ops.reference import aggregate_reference
assert mmevo.__file__.startswith(sys.argv[1]), mmevo.__file__
assert cpp_backend.available(), 'the C++ extension was not built'
gen = torch.Generator().manual_seed(0)
x = torch.randn(2, 4, 5, 7, generator=gen, dtype=torch.float64)
w = torch.randn(2, 2, 3, 3, 3, 4, generator=gen, dtype=torch.float64)
with use_backend('cpp'):
    y = evolution_aggregate(x, w, 2, 1, 1, 'reflect')
ref = aggregate_reference(x, w, Window(3, 2, 1, 1, 'reflect'))
torch.testing.assert_close(y, ref)
print(mmevo.__file__)
"""


def run(cmd, **kwargs):
    proc = subprocess.run(
        cmd, capture_output=True, text=True, timeout=1200, **kwargs
    )
    assert proc.returncode == 0, (
        cmd,
        proc.stdout[-3000:],
        proc.stderr[-3000:],
    )
    return proc.stdout


def copy_worktree(dest):
    """The files git would commit (tracked, or new and not ignored)."""
    files = run(
        [
            'git',
            'ls-files',
            '-z',
            '--cached',
            '--others',
            '--exclude-standard',
        ],
        cwd=REPO,
    ).split('\0')
    for name in filter(None, files):
        src = osp.join(REPO, name)
        if osp.isfile(src):  # not a deletion yet to be committed
            os.makedirs(osp.dirname(osp.join(dest, name)), exist_ok=True)
            shutil.copy2(src, osp.join(dest, name))


def build_sdist(src, outdir):
    """``python -m build --sdist --no-isolation`` (``build`` is pinned in
    tools/setup_env.sh)."""
    run(
        [
            sys.executable,
            '-m',
            'build',
            '--sdist',
            '--no-isolation',
            '--outdir',
            outdir,
            src,
        ]
    )
    (sdist,) = glob.glob(osp.join(outdir, 'mmevo-*.tar.gz'))
    return sdist


@pytest.mark.slow
@pytest.mark.skipif(shutil.which('git') is None, reason='needs git')
def test_sdist_installs_and_runs_in_a_fresh_venv(tmp_path):
    src = tmp_path / 'src'
    copy_worktree(str(src))
    sdist = build_sdist(str(src), str(tmp_path / 'dist'))
    assert osp.basename(sdist) == f'mmevo-{mmevo.__version__}.tar.gz'
    with tarfile.open(sdist) as tar:
        names = {n.split('/', 1)[1] for n in tar.getnames() if '/' in n}
    csrc = sorted(
        osp.relpath(p, REPO)
        for p in glob.glob(osp.join(REPO, 'mmevo', 'ops', 'csrc', '*'))
    )
    assert csrc and set(csrc) <= names, set(csrc) - names
    assert {'LICENSE', 'README.md', 'setup.py', 'pyproject.toml'} <= names

    venv = tmp_path / 'venv'
    run([sys.executable, '-m', 'venv', '--without-pip', str(venv)])
    venv_python = str(venv / 'bin' / 'python')
    purelib = run(
        [
            venv_python,
            '-c',
            'import sysconfig; print(sysconfig.get_paths()["purelib"])',
        ]
    ).strip()
    ours = {sysconfig.get_paths()['purelib'], *site.getsitepackages()}
    with open(osp.join(purelib, 'outer_site.pth'), 'w') as f:
        f.write('\n'.join(sorted(ours)) + '\n')
    env = {k: v for k, v in os.environ.items() if k != 'PYTHONPATH'}
    run(
        [
            sys.executable,
            '-m',
            'pip',
            '--python',
            venv_python,
            'install',
            '-q',
            '--no-build-isolation',
            '--no-deps',
            '--no-index',
            '--ignore-installed',
            sdist,
        ],
        env=env,
        cwd=str(tmp_path),
    )
    out = run(
        [venv_python, '-c', RUN_AN_OP, str(venv)], env=env, cwd=str(tmp_path)
    )
    assert out.strip().startswith(str(venv))
