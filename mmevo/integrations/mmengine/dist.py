"""Fix: mmengine 0.10.7's distributed runs need a GPU.

mmengine 0.10.7 assumes a GPU per process: its ``pytorch`` and ``slurm``
launchers call ``torch.cuda.set_device`` (which raises on a CPU-only build of
torch), and ``Runner.wrap_model`` passes ``device_ids=[LOCAL_RANK]`` to
``DistributedDataParallel``, which DDP refuses for a module on the CPU. And
``SyncBatchNorm`` only runs on accelerators. :func:`setup_cpu_distributed`
works around all three from the outside, without touching site-packages:

* it initialises the process group itself over gloo (``Runner.setup_env``
  skips ``init_dist`` when a group already exists);
* it points ``model_wrapper_cfg`` at :class:`CPUDistributedDataParallel`,
  which drops the ``device_ids`` for CPU modules;
* it turns every ``SyncBN`` in the config into ``BN``, with a warning.

On every machine it also bounds a collective's wait: a rank that stalls
(stopped, deadlocked) makes the others fail after
``env_cfg.dist_cfg.timeout`` seconds, :data:`DEFAULT_DIST_TIMEOUT` unless the
config sets it. mmengine's own ``init_dist`` (the GPU path) reads the same
key. Delete this module when mmengine's launchers run without a GPU.
"""

import os
import subprocess
import warnings
from datetime import timedelta

import torch
import torch.distributed as torch_dist
from mmengine.config import ConfigDict
from mmengine.model import MMDistributedDataParallel
from mmengine.registry import MODEL_WRAPPERS

from ._version import check_mmengine

_SYNC_BN_TYPES = ('SyncBN', 'MMSyncBN', 'SyncBatchNorm')
# Seconds a collective waits for the other ranks (torch's own default for
# gloo): long enough for a slow first step or checkpoint, bounded still
DEFAULT_DIST_TIMEOUT = 1800


class CPUDistributedDataParallel(MMDistributedDataParallel):
    """``MMDistributedDataParallel`` that also wraps a module on the CPU.

    ``Runner.wrap_model`` always passes ``device_ids=[LOCAL_RANK]``; DDP
    accepts ``device_ids`` only for a module on a single accelerator and needs
    ``None`` for a CPU module. This wrapper drops them in that case and is
    otherwise ``MMDistributedDataParallel``.

    Args:
        module (nn.Module): The model to wrap.
        **kwargs: ``DistributedDataParallel`` arguments.

    Example:
        >>> # in a config (after install()); set by setup_cpu_distributed
        >>> model_wrapper_cfg = dict(type='CPUDistributedDataParallel')
    """

    def __init__(self, module, **kwargs):
        if all(p.device.type == 'cpu' for p in module.parameters()):
            kwargs['device_ids'] = None
            kwargs['output_device'] = None
        super().__init__(module=module, **kwargs)


def _replace_sync_bn(node, path, found):
    """Replace SyncBN norm types in a config tree in place; record where."""
    if isinstance(node, dict):
        if node.get('type') in _SYNC_BN_TYPES:
            found.append(f'{path or "cfg"}.type={node["type"]}')
            node['type'] = 'BN'
        for key, value in node.items():
            _replace_sync_bn(value, f'{path}.{key}' if path else key, found)
    elif isinstance(node, (list, tuple)):
        for i, value in enumerate(node):
            _replace_sync_bn(value, f'{path}[{i}]', found)


def convert_sync_bn_to_bn(cfg):
    """Turn every SyncBN of ``cfg`` into BN (in place) and warn.

    Used when there is no GPU: ``SyncBatchNorm`` raises on CPU tensors, and a
    per-process BN is what a single-GPU run of the config does anyway. The
    runner-level ``cfg.sync_bn`` switch is removed for the same reason.

    Args:
        cfg (mmengine.Config): The config, changed in place.

    Returns:
        list[str]: Where SyncBN was replaced (empty when nothing changed).

    Example:
        >>> from mmengine import Config
        >>> cfg = Config(dict(model=dict(norm_cfg=dict(type='SyncBN'))))
        >>> convert_sync_bn_to_bn(cfg)
        ['model.norm_cfg.type=SyncBN']
    """
    found = []
    for key in list(cfg.keys()):
        _replace_sync_bn(cfg[key], key, found)
    if cfg.get('sync_bn', None) is not None:
        found.append(f'sync_bn={cfg.sync_bn}')
        cfg.pop('sync_bn')
    if found:
        warnings.warn(
            'No GPU: SyncBN does not run on the CPU, using BN instead '
            f'(replaced {", ".join(found)}).',
            stacklevel=2,
        )
    return found


def _dist_env_from_slurm():
    """Fill torch.distributed's env:// variables from SLURM's (as mmengine's
    ``_init_dist_slurm`` does, without its CUDA calls)."""
    ntasks = int(os.environ['SLURM_NTASKS'])
    os.environ['RANK'] = os.environ['SLURM_PROCID']
    os.environ['WORLD_SIZE'] = str(ntasks)
    os.environ['LOCAL_RANK'] = os.environ.get('SLURM_LOCALID', '0')
    os.environ.setdefault('MASTER_PORT', '29500')
    if 'MASTER_ADDR' not in os.environ:
        node_list = os.environ['SLURM_NODELIST']
        os.environ['MASTER_ADDR'] = subprocess.getoutput(
            f'scontrol show hostname {node_list} | head -n1'
        )


def setup_cpu_distributed(cfg, launcher):
    """Prepare ``cfg`` (in place) and the process group for a CPU-only run.

    For a distributed ``launcher``, sets ``env_cfg.dist_cfg.timeout``
    (seconds) to :data:`DEFAULT_DIST_TIMEOUT` unless the config has one.
    Nothing else when a GPU is available (mmengine's own path then works).
    Otherwise converts SyncBN to BN (:func:`convert_sync_bn_to_bn`) and, for
    ``launcher`` 'pytorch' or 'slurm', initialises the default process group
    over gloo, with that timeout, and makes the runner wrap the model in
    :class:`CPUDistributedDataParallel`.

    Args:
        cfg (mmengine.Config): The training/testing config, changed in place.
        launcher (str): 'none', 'pytorch' or 'slurm' ('mpi' is left to
            mmengine).

    Returns:
        bool: Whether this call initialised a CPU process group.

    Example:
        >>> # in tools/train.py, before Runner.from_cfg(cfg)
        >>> setup_cpu_distributed(cfg, args.launcher)
    """
    if launcher != 'none':
        dist_cfg = cfg.setdefault('env_cfg', ConfigDict()).setdefault(
            'dist_cfg', ConfigDict()
        )
        if dist_cfg.get('timeout') is None:
            dist_cfg['timeout'] = DEFAULT_DIST_TIMEOUT
    if torch.cuda.is_available():
        return False
    convert_sync_bn_to_bn(cfg)
    if launcher not in ('pytorch', 'slurm'):
        return False
    install()
    if launcher == 'slurm':
        _dist_env_from_slurm()
    dist_cfg['backend'] = 'gloo'
    if not torch_dist.is_initialized():
        torch_dist.init_process_group(
            backend='gloo', timeout=timedelta(seconds=dist_cfg['timeout'])
        )
    wrapper = cfg.get('model_wrapper_cfg', None)
    if wrapper is None:
        cfg.model_wrapper_cfg = dict(
            type='CPUDistributedDataParallel',
            broadcast_buffers=False,
            find_unused_parameters=cfg.get('find_unused_parameters', False),
        )
    elif wrapper.get('type', 'MMDistributedDataParallel') in (
        'MMDistributedDataParallel',
        'DistributedDataParallel',
    ):
        wrapper['type'] = 'CPUDistributedDataParallel'
    return True


def install():
    """Register :class:`CPUDistributedDataParallel` in mmengine's
    ``MODEL_WRAPPERS``; idempotent.

    Example:
        >>> install()
        >>> model_wrapper_cfg = dict(type='CPUDistributedDataParallel')
    """
    check_mmengine('CPU distributed')
    name = 'CPUDistributedDataParallel'
    if MODEL_WRAPPERS.module_dict.get(name) is not CPUDistributedDataParallel:
        MODEL_WRAPPERS.register_module(module=CPUDistributedDataParallel)
