"""Configs, models and runners as the tools build them.

Example:
    >>> cfg = load_config('configs/rednet50_fpn_coco.py', work_dir='w')
    >>> model = build_model(cfg, 'w/epoch_12.pth')
    >>> runner = build_runner(cfg, launcher='none')
"""

import os
import os.path as osp
from collections.abc import Mapping

from mmengine.config import Config
from mmengine.model import revert_sync_batchnorm
from mmengine.registry import MODELS, RUNNERS, init_default_scope
from mmengine.runner import Runner

import mmevo
from mmevo.datasets import (
    MissingDataError,
    check_data_exists,
    check_pretrained_exists,
)
from mmevo.integrations.mmengine import atomic_backend, install_all

from .checkpoint import check_checkpoint_fits
from .outputs import check_output


def default_work_dir(config, suffix=''):
    """``./work_dirs/<config name><suffix>``, mmdet's default work dir.

    Example:
        >>> default_work_dir('configs/rednet50_fpn_coco.py')
        './work_dirs/rednet50_fpn_coco'
    """
    name = osp.splitext(osp.basename(config))[0]
    return osp.join('./work_dirs', name + suffix)


def load_config(path, cfg_options=None, work_dir=None, work_dir_suffix=''):
    """The config at ``path`` with the command line's overrides; mmevo's
    modules registered first (:func:`mmevo.register_all_modules`), so that
    its types build whatever the config imports. mmevo's mmengine fixes stay
    as they are (:func:`build_runner` turns them on).

    Args:
        path (str | Path): The config file.
        cfg_options (dict, optional): ``--cfg-options`` to merge.
        work_dir (str | Path, optional): ``--work-dir``; else the config's,
            else :func:`default_work_dir` (with ``work_dir_suffix``).
        work_dir_suffix (str): See above. Default: ''.

    Returns:
        mmengine.Config: The config.

    Raises:
        MissingDataError: The file does not exist.
    """
    path = os.fspath(path)
    if not osp.isfile(path):
        raise MissingDataError(f"config file '{path}' does not exist")
    mmevo.register_all_modules()
    cfg = Config.fromfile(path)
    if cfg_options:
        cfg.merge_from_dict(cfg_options)
    if work_dir is not None:  # a str: mmengine dumps the config as text
        cfg.work_dir = os.fspath(work_dir)
    elif cfg.get('work_dir', None) is None:
        cfg.work_dir = default_work_dir(path, work_dir_suffix)
    return cfg


def check_data(cfg, dataloaders, pretrained=False):
    """Raise :class:`mmevo.datasets.MissingDataError` if the run's data (or,
    with ``pretrained``, a local ``Pretrained`` checkpoint the model
    initialises from) is missing.

    Args:
        cfg (mmengine.Config): The config.
        dataloaders (str | Sequence[str]): The dataloader key the run uses
            (``'test_dataloader'``), or several.
        pretrained (bool): Also check the pretrained checkpoints (training).
            Default: False.

    Example:
        >>> check_data(cfg, 'test_dataloader')
    """
    if isinstance(dataloaders, str):
        dataloaders = [dataloaders]
    check_data_exists(cfg, dataloaders)
    if pretrained:
        check_pretrained_exists(cfg)


def dump_results(cfg, out, inputs=None):
    """Make ``cfg``'s test run also dump the raw predictions to ``out``
    (mmengine's ``DumpResults``, generic, mmdet and mmseg alike, written
    atomically: :class:`mmevo.integrations.mmengine.AtomicDumpResults`).
    ``out`` is checked first (:func:`mmevo.apis.check_output`), so that
    the run fails before its evaluation, not after it.

    Args:
        cfg (mmengine.Config): The config; its ``test_evaluator`` grows.
        out (str | Path): The pickle file.
        inputs (dict, optional): What the run reads (``{name: path}``),
            which ``out`` must not be.

    Raises:
        OutputPathError: ``out`` cannot or must not be written.

    Example:
        >>> dump_results(cfg, 'preds.pkl', {'checkpoint': 'epoch_20.pth'})
    """
    out = check_output(out, inputs)
    atomic_backend.install()  # registers the metric
    evaluators = cfg.test_evaluator
    if not isinstance(evaluators, (list, tuple)):
        evaluators = [evaluators]
    cfg.test_evaluator = [
        *list(evaluators),
        dict(type=atomic_backend.DUMP_RESULTS, out_file_path=out),
    ]


def build_model(cfg, checkpoint=None, device='cpu', hint=''):
    """The config's model on ``device`` in eval mode, SyncBN as BN, with the
    weights of ``checkpoint`` (which must fit, see
    :func:`mmevo.apis.check_checkpoint_fits`).

    Args:
        cfg (mmengine.Config | str | Path): A model config, or its file
            (read with :func:`load_config`).
        checkpoint (str | Path, optional): Weights to load. Default: None.
        device (str): Default: 'cpu'.
        hint (str): What to do about a misfit checkpoint, for the message.

    Returns:
        nn.Module: The model.

    Raises:
        CheckpointError: The checkpoint cannot be loaded or does not fit.
        TypeError: ``cfg`` is neither a config nor a file name.

    Example:
        >>> model = build_model('configs/demo/retinanet.py', 'epoch_20.pth')
    """
    if isinstance(cfg, (str, os.PathLike)):
        cfg = load_config(cfg)
    if not isinstance(cfg, (Config, Mapping)):
        raise TypeError(
            'build_model: cfg must be an mmengine Config (load_config) or '
            f'a config file name, got {type(cfg).__name__}'
        )
    init_default_scope(cfg.get('default_scope', 'mmdet'))
    model = revert_sync_batchnorm(MODELS.build(cfg['model']))
    if checkpoint is not None:
        state = check_checkpoint_fits(model, checkpoint, hint)
        # it fits: every key, strictly (as mmengine, without 'module.')
        model.load_state_dict(_strip_module(state), strict=True)
    return model.to(device).eval()


def _strip_module(checkpoint):
    state = checkpoint.get('state_dict', checkpoint)
    return {
        k[len('module.') :] if k.startswith('module.') else k: v
        for k, v in state.items()
    }


def build_runner(cfg):
    """The config's runner (``runner_type`` when it names one), with mmevo's
    mmengine fixes turned on first
    (:func:`mmevo.integrations.mmengine.install_all`: crash-safe
    checkpoints, bit-exact resume, CPU distributed runs).

    Example:
        >>> runner = build_runner(cfg)
        >>> runner.test()
    """
    install_all()
    if 'runner_type' in cfg:
        return RUNNERS.build(cfg)
    return Runner.from_cfg(cfg)
