"""CPU-only distributed pieces: SyncBN -> BN in configs, DDP on a CPU module
(the 2-process run is tests/tools/test_dist_train.py), the timeout that ends a
job when a rank stalls."""

import os
import socket
import subprocess
import sys

import pytest
import torch
import torch.distributed as dist
from mmengine.config import Config

from mmevo.integrations.mmengine import (
    DEFAULT_DIST_TIMEOUT,
    convert_sync_bn_to_bn,
    setup_cpu_distributed,
)

pytestmark = pytest.mark.slow

REPO = os.path.dirname(
    os.path.dirname(
        os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    )
)


def _cfg():
    return Config(
        dict(
            norm_cfg=dict(type='SyncBN', requires_grad=True),
            model=dict(
                backbone=dict(
                    norm_cfg=dict(type='SyncBN', requires_grad=True)
                ),
                heads=[
                    dict(norm_cfg=dict(type='MMSyncBN')),
                    dict(norm_cfg=dict(type='GN', num_groups=4)),
                ],
            ),
            sync_bn='torch',
        )
    )


def test_sync_bn_becomes_bn_with_a_warning():
    cfg = _cfg()
    with pytest.warns(UserWarning, match='SyncBN does not run on the CPU'):
        found = convert_sync_bn_to_bn(cfg)
    assert found == [
        'norm_cfg.type=SyncBN',
        'model.backbone.norm_cfg.type=SyncBN',
        'model.heads[0].norm_cfg.type=MMSyncBN',
        'sync_bn=torch',
    ]
    assert cfg.norm_cfg == dict(type='BN', requires_grad=True)
    assert cfg.model.backbone.norm_cfg.type == 'BN'
    assert cfg.model.heads[0].norm_cfg.type == 'BN'
    assert cfg.model.heads[1].norm_cfg.type == 'GN'
    assert 'sync_bn' not in cfg


def test_nothing_to_convert_is_silent(recwarn):
    cfg = Config(dict(model=dict(norm_cfg=dict(type='BN'))))
    assert convert_sync_bn_to_bn(cfg) == []
    assert not [w for w in recwarn if 'SyncBN' in str(w.message)]


@pytest.mark.skipif(torch.cuda.is_available(), reason='CPU-only path')
def test_setup_without_launcher_only_converts():
    cfg = _cfg()
    with pytest.warns(UserWarning):
        assert setup_cpu_distributed(cfg, 'none') is False
    assert 'model_wrapper_cfg' not in cfg and not dist.is_initialized()


_DDP_SCRIPT = """
import sys
import torch, torch.distributed as dist, torch.nn as nn
from mmengine.registry import MODEL_WRAPPERS
from mmevo.integrations.mmengine import CPUDistributedDataParallel, dist as fix
fix.install()
dist.init_process_group('gloo', init_method='file://' + sys.argv[1],
                        rank=0, world_size=1)
torch.manual_seed(0)
module = nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2))
# as Runner.wrap_model builds it: device_ids=[LOCAL_RANK]
ddp = MODEL_WRAPPERS.build(
    dict(type='CPUDistributedDataParallel', broadcast_buffers=False),
    default_args=dict(module=module, device_ids=[0]))
assert isinstance(ddp, CPUDistributedDataParallel)
assert ddp.device_ids is None
x = torch.randn(5, 4)
assert torch.equal(ddp(x), module(x))
ddp(x).sum().backward()
assert all(p.grad is not None for p in module.parameters())
del ddp  # the reducer holds the group: release it before destroying
dist.destroy_process_group()
print('ok')
"""


def test_cpu_ddp_wraps_a_cpu_module(tmp_path):
    # In a process of its own: a gloo group created inside the pytest
    # process could hang its teardown after the many tests before it.
    out = subprocess.run(
        [sys.executable, '-c', _DDP_SCRIPT, str(tmp_path / 'store')],
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(os.environ, PYTHONPATH=REPO),
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip() == 'ok'


def test_slurm_variables_become_torch_env(monkeypatch):
    from mmevo.integrations.mmengine.dist import _dist_env_from_slurm

    for key in ('RANK', 'WORLD_SIZE', 'LOCAL_RANK', 'MASTER_PORT'):
        # set, then delete: monkeypatch then restores the variables the
        # function writes
        monkeypatch.setenv(key, '')
        monkeypatch.delenv(key)
    monkeypatch.setenv('SLURM_PROCID', '5')
    monkeypatch.setenv('SLURM_NTASKS', '8')
    monkeypatch.setenv('SLURM_LOCALID', '1')
    monkeypatch.setenv('SLURM_NODELIST', 'node[1-2]')
    monkeypatch.setenv('MASTER_ADDR', 'node1')  # else: scontrol show hostname
    _dist_env_from_slurm()
    assert (
        os.environ['RANK'],
        os.environ['WORLD_SIZE'],
        os.environ['LOCAL_RANK'],
        os.environ['MASTER_PORT'],
        os.environ['MASTER_ADDR'],
    ) == ('5', '8', '1', '29500', 'node1')


@pytest.mark.skipif(torch.cuda.is_available(), reason='CPU-only path')
def test_distributed_launchers_get_a_default_timeout():
    # 'mpi' is left to mmengine (its init_dist reads dist_cfg.timeout)
    cfg = Config(dict(model=dict()))
    assert setup_cpu_distributed(cfg, 'mpi') is False
    assert cfg.env_cfg.dist_cfg.timeout == DEFAULT_DIST_TIMEOUT
    cfg = Config(dict(env_cfg=dict(dist_cfg=dict(timeout=60))))
    setup_cpu_distributed(cfg, 'mpi')
    assert cfg.env_cfg.dist_cfg.timeout == 60
    cfg = Config(dict(model=dict()))
    setup_cpu_distributed(cfg, 'none')
    assert 'env_cfg' not in cfg


# One rank of two stops (SIGSTOP) after a first all-reduce; the other must
# give up after the default timeout (set to 3 s here) and exit non-zero. The
# ranks wait for a go file after their (slow) imports: the 3 s also bound
# the rendezvous.
_STALL_SCRIPT = """
import os, signal, sys, time
import torch, torch.distributed as dist
from mmengine.config import Config
from mmevo.integrations.mmengine import dist as fix
print('ready', flush=True)
while not os.path.exists(sys.argv[1]):
    time.sleep(0.05)
fix.DEFAULT_DIST_TIMEOUT = 3
fix.setup_cpu_distributed(Config(dict()), 'pytorch')
x = torch.ones(1)
dist.all_reduce(x)
if dist.get_rank() == 1:
    os.kill(os.getpid(), signal.SIGSTOP)
start = time.monotonic()
try:
    dist.all_reduce(x)
except RuntimeError:
    print(f'gave up after {time.monotonic() - start:.0f} s', flush=True)
    os._exit(3)
"""


def test_a_stalled_rank_ends_the_job(tmp_path):
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        port = s.getsockname()[1]
    go = tmp_path / 'go'
    procs = [
        subprocess.Popen(
            [sys.executable, '-c', _STALL_SCRIPT, str(go)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=dict(
                os.environ,
                PYTHONPATH=REPO,
                RANK=str(rank),
                LOCAL_RANK=str(rank),
                WORLD_SIZE='2',
                MASTER_ADDR='127.0.0.1',
                MASTER_PORT=str(port),
                OMP_NUM_THREADS='1',
            ),
        )
        for rank in (0, 1)
    ]
    try:
        for p in procs:
            assert p.stdout.readline() == 'ready\n'
        go.touch()
        out, err = procs[0].communicate(timeout=90)
    finally:
        for p in procs:
            p.kill()
            p.communicate()
    assert procs[0].returncode == 3, err[-3000:]
    seconds = int(out.split()[3])
    assert 3 <= seconds <= 10, out
