"""Check, before anything is built, that a config's data is on disk.

Without this check a missing data set surfaces as a ``FileNotFoundError``
deep inside dataset construction (in a dataloader worker, or once per rank),
after the model was built. :func:`check_data_exists` finds the first missing
path of the dataloaders a run needs, and :class:`MissingDataError` carries a
one-line message saying which path is missing and where the instructions
to get the data are. What a program does then (the tools print the line and
exit with status 2) is the program's business.
"""

import os.path as osp

# How to get the data, by dataset type (docs/datasets.md has the details).
_HOW_TO_GET = {
    'CocoDataset': (
        'download COCO 2017 as described in docs/datasets.md (COCO)'
    ),
    'CityscapesDataset': (
        'download and convert Cityscapes as described in '
        'docs/datasets.md (Cityscapes)'
    ),
    'ImageNet': (
        'download ImageNet (ILSVRC 2012) and lay it out as described in '
        'docs/datasets.md (ImageNet)'
    ),
    'ADE20KDataset': (
        'download ADEChallengeData2016 as described in '
        'docs/datasets.md (ADE20K)'
    ),
}
# The generated demo set of each dataset type (``make_synthetic_data.py``).
_SYNTHETIC_KIND = {'CityscapesDataset': 'seg', 'ImageNet': 'cls'}
# The demo sets are generated, not downloaded.
_SYNTHETIC_HINT = (
    'generate it with `python tools/misc/make_synthetic_data.py {}`'
)


class MissingDataError(FileNotFoundError):
    """A path a config's dataset needs does not exist (one-line message).

    Args:
        message (str): One line: what is missing and how to get it.
        synthetic (str, optional): 'det', 'seg' or 'cls' when the missing
            set is a generated demo set (``make_synthetic_data.py
            det|seg|cls``), for a program to add its own hint. Default: None.
    """

    def __init__(self, message, synthetic=None):
        super().__init__(message)
        self.synthetic = synthetic


def _dataset_cfgs(dataset, key):
    """Yield (key, config) of the leaf datasets of ``dataset``, through the
    wrappers (``RepeatDataset``, ``ClassBalancedDataset``, ``ConcatDataset``,
    ...)."""
    if 'datasets' in dataset:
        for i, sub in enumerate(dataset['datasets']):
            yield from _dataset_cfgs(sub, f'{key}.datasets.{i}')
    elif 'dataset' in dataset:
        yield from _dataset_cfgs(dataset['dataset'], f'{key}.dataset')
    else:
        yield key, dataset


def _needed_paths(dataset):
    """(what, path) pairs a leaf dataset config reads, joined with
    ``data_root`` as mmengine's ``BaseDataset`` joins them.

    mmpretrain's datasets take ``data_prefix`` as a string too, and its
    ``ImageNet`` a ``split``: the images are then under ``<split>/`` (in
    class folders, or listed by ``meta/<split>.txt`` when that file exists,
    which is optional)."""
    root = dataset.get('data_root') or ''
    if root:
        yield 'data_root', root
    ann_file = dataset.get('ann_file') or ''
    if ann_file:
        yield 'ann_file', osp.join(root, ann_file)
    prefixes = dataset.get('data_prefix') or {}
    if isinstance(prefixes, str):
        prefixes = {'': prefixes}
    split = dataset.get('split') or ''
    if split and not prefixes:
        prefixes = {'': split}
    for key, prefix in sorted(prefixes.items()):
        if isinstance(prefix, str) and prefix:
            what = f'data_prefix.{key}' if key else 'data_prefix'
            if not dataset.get('data_prefix'):
                what = f"split '{split}' folder"
            yield what, osp.join(root, prefix)


def check_data_exists(cfg, dataloaders=('train_dataloader',)):
    """Raise :class:`MissingDataError` if a dataset path of ``cfg`` is missing.

    Checks ``data_root``, ``ann_file`` and the ``data_prefix`` directories of
    every dataset of the named dataloaders (those absent from ``cfg``, or
    ``None``, are skipped; so are remote paths such as ``s3://``).

    Args:
        cfg (mmengine.Config): The config.
        dataloaders (Sequence[str]): Dataloader keys the run uses, e.g.
            ``('train_dataloader', 'val_dataloader')``.

    Raises:
        MissingDataError: One line naming the dataloader, the missing path
            and how to get the data.

    Example:
        >>> from mmengine import Config
        >>> cfg = Config(dict(train_dataloader=dict(dataset=dict(
        ...     type='CocoDataset', data_root='data/nowhere/'))))
        >>> check_data_exists(cfg)
        Traceback (most recent call last):
        MissingDataError: train_dataloader: data_root 'data/nowhere/' ...
    """
    for name in dataloaders:
        loader = cfg.get(name, None)
        if not loader or not loader.get('dataset'):
            continue
        for key, dataset in _dataset_cfgs(
            loader['dataset'], f'{name}.dataset'
        ):
            for what, path in _needed_paths(dataset):
                if '://' in path or osp.exists(path):
                    continue
                dtype = dataset.get('type', 'the dataset')
                synthetic = None
                if 'synthetic' in path:
                    synthetic = _SYNTHETIC_KIND.get(dtype, 'det')
                    how = _SYNTHETIC_HINT.format(synthetic)
                else:
                    how = _HOW_TO_GET.get(
                        dtype,
                        f'get the {dtype} data as described in '
                        'docs/datasets.md',
                    )
                raise MissingDataError(
                    f"{name}: {what} '{path}' does not exist; {how}, or point "
                    f'the config at your copy with --cfg-options '
                    f'{key}.data_root=PATH',
                    synthetic,
                )


def _pretrained_cfgs(node, key):
    """Yield (key, init_cfg) of each ``Pretrained`` init_cfg under ``node``."""
    if isinstance(node, dict):
        init_cfgs = node.get('init_cfg')
        for i, init in enumerate(
            init_cfgs if isinstance(init_cfgs, list) else [init_cfgs]
        ):
            if isinstance(init, dict) and init.get('type') == 'Pretrained':
                suffix = f'[{i}]' if isinstance(init_cfgs, list) else ''
                yield f'{key}.init_cfg{suffix}', init
        for k, v in node.items():
            if k != 'init_cfg':
                yield from _pretrained_cfgs(v, f'{key}.{k}')
    elif isinstance(node, (list, tuple)):
        for i, v in enumerate(node):
            yield from _pretrained_cfgs(v, f'{key}.{i}')


def check_pretrained_exists(cfg):
    """Raise :class:`MissingDataError` if a local ``Pretrained`` checkpoint of
    ``cfg.model`` is missing.

    Training initialises the model after building it; without this check a
    missing ImageNet checkpoint surfaces as mmengine's traceback at that
    point. Remote checkpoints (``open-mmlab://``, ``https://``, ...) are
    left to mmengine.

    Args:
        cfg (mmengine.Config): The config.

    Raises:
        MissingDataError: One line naming the config key and the path.

    Example:
        >>> cfg = Config(dict(model=dict(backbone=dict(init_cfg=dict(
        ...     type='Pretrained', checkpoint='nowhere.pth')))))
        >>> check_pretrained_exists(cfg)
        Traceback (most recent call last):
        MissingDataError: model.backbone.init_cfg.checkpoint 'nowhere.pth' ...
    """
    for key, init in _pretrained_cfgs(cfg.get('model', None), 'model'):
        path = init.get('checkpoint')
        if path and '://' not in path and not osp.exists(path):
            raise MissingDataError(
                f"{key}.checkpoint '{path}' does not exist; download the "
                'published ImageNet checkpoint (configs/rednet/README.md), '
                f'or set --cfg-options {key}.checkpoint=PATH (or '
                f'{key}=None to train from scratch)'
            )
