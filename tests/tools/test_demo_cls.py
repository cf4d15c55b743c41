"""Classification through the tools, end to end in small.

The ``make demo-cls`` config, shortened (one epoch on a tiny synthetic set),
trained by ``tools/train.py`` and evaluated again by ``tools/test.py``;
mmpretrain's own ``tools/train.py`` and ``mmpretrain.apis``, with
nothing but the config's ``custom_imports`` to find mmevo; and an ImageNet
config taking an official-format checkpoint strictly.
"""

import os
import os.path as osp
import pickle
import subprocess
import sys

import pytest
import torch

import mmevo
from mmevo.demo import CLS_CLASSES, make_synthetic_imagenet

from tool_utils import REPO, load_tool

pytestmark = pytest.mark.slow

# Modules and fixes (the allowlist of mmengine's checkpoint types), as
# mmevo's tools have them.
mmevo.register_all_modules(install_fixes=True)

DEMO_CLS = osp.join(
    REPO,
    'configs',
    'demo',
    'rednet26-tiny_1xb32-warmup-coslr-30e_synthetic-imagenet-64px.py',
)
REDNET50 = osp.join(
    REPO, 'configs', 'rednet', 'rednet50_64xb32-warmup-coslr_in1k.py'
)

SMALL = """
_base_ = '{base}'
data_root = '{root}'
train_dataloader = dict(
    batch_size=4, num_workers=0, persistent_workers=False,
    dataset=dict(data_root=data_root))
val_dataloader = dict(
    batch_size=4, num_workers=0, persistent_workers=False,
    dataset=dict(data_root=data_root))
test_dataloader = val_dataloader
train_cfg = dict(max_epochs=1, val_interval=1)
default_hooks = dict(checkpoint=dict(interval=1))
"""


# The libraries' own tools read the runner's checkpoints under torch >= 2.6
# only with mmevo's fixes, which a config asks for by name.
OPT_IN_FIXES = """
custom_imports = dict(
    imports=['mmevo.models', 'mmevo.integrations.mmengine.enable_all'],
    allow_failed_imports=False)
"""


@pytest.fixture(scope='module')
def tiny_imagenet(tmp_path_factory):
    """20 train / 10 val images in the ImageNet folder layout."""
    root = str(tmp_path_factory.mktemp('tiny_imagenet'))
    make_synthetic_imagenet(root, num_train=20, num_val=10)
    return root


def _small_config(tmp_path, base, root, extra=''):
    cfg = tmp_path / 'cfg.py'
    cfg.write_text(SMALL.format(base=base, root=root) + extra)
    return str(cfg)


def test_demo_train_then_test(tiny_imagenet, tmp_path):
    cfg = _small_config(tmp_path, DEMO_CLS, tiny_imagenet)
    runner = load_tool('train').main(
        [
            cfg,
            '--work-dir',
            str(tmp_path / 'work'),
            '--cfg-options',
            'experiment_name=demo_cls',
            'visualizer.name=demo_cls',
        ]
    )
    top1 = runner.message_hub.get_scalar('val/accuracy/top1').current()
    assert 0 <= top1 <= 100
    with open(tmp_path / 'work' / 'last_checkpoint') as f:
        ckpt = f.read().strip()
    assert osp.basename(ckpt) == 'epoch_1.pth'
    out = tmp_path / 'preds.pkl'
    metrics = load_tool('test').main(
        [
            cfg,
            ckpt,
            '--work-dir',
            str(tmp_path / 'test'),
            '--out',
            str(out),
            '--cfg-options',
            'experiment_name=demo_cls_test',
            'visualizer.name=demo_cls_test',
        ]
    )
    # the checkpoint holds the model that was validated after training
    assert metrics['accuracy/top1'] == pytest.approx(top1)
    with open(out, 'rb') as f:
        preds = pickle.load(f)
    assert len(preds) == 10
    assert sorted(int(p['gt_label']) for p in preds) == list(range(10))
    assert all(p['pred_score'].shape == (10,) for p in preds)


def test_missing_demo_set_names_the_generator(tmp_path, capsys):
    cfg = _small_config(tmp_path, DEMO_CLS, str(tmp_path / 'synthetic_none'))
    with pytest.raises(SystemExit) as info:
        load_tool('train').main([cfg])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err.count('\n') == 1
    # as for the synthetic COCO and Cityscapes sets: the generator command
    assert "data_root '" in err and 'synthetic_none' in err
    assert '`python tools/misc/make_synthetic_data.py cls`' in err


MMPRETRAIN_PATH = """
import os.path as osp
import runpy
import sys

import mmpretrain

config, work_dir, image = sys.argv[1:4]
assert 'mmevo' not in sys.modules
tool = osp.join(osp.dirname(mmpretrain.__file__), '.mim', 'tools', 'train.py')
if osp.isfile(tool):  # mmpretrain's own tools/train.py, as `mim train` runs it
    sys.argv = [tool, config, '--work-dir', work_dir]
    runpy.run_path(tool, run_name='__main__')
    print('RAN', tool)
else:  # what that tool does: Config.fromfile, then Runner.from_cfg().train()
    from mmengine.config import Config
    from mmengine.runner import Runner
    cfg = Config.fromfile(config)  # custom_imports: imports mmevo
    cfg.work_dir = work_dir
    Runner.from_cfg(cfg).train()
    print('RAN Runner.from_cfg')
assert 'mmevo' in sys.modules  # found through the config's custom_imports

# The runner checkpoint's HistoryBuffers load under torch >= 2.6's
# weights_only default (mmengine 0.10.7's torch.load) only with mmevo's
# allowlist: the config opts in (mmevo.integrations.mmengine.enable_all).
from mmpretrain.apis import ImageClassificationInferencer, get_model
model = get_model(config, pretrained=work_dir + '/epoch_1.pth')
assert type(model.backbone).__name__ == 'RedNet'
inferencer = ImageClassificationInferencer(
    model=config, pretrained=work_dir + '/epoch_1.pth')
(result, ) = inferencer(image)
print('PREDICTED', result['pred_class'], result['pred_label'])
"""


def test_mmpretrain_train_tool_with_custom_imports(tiny_imagenet, tmp_path):
    """mmpretrain's own ``tools/train.py`` (shipped in the package as
    ``mmpretrain/.mim/tools/train.py``; without it, what it does:
    ``Config.fromfile``, then ``Runner.from_cfg(cfg).train()``) on the demo
    config, in a fresh interpreter that never imports mmevo itself; then
    ``mmpretrain.apis`` on the checkpoint, which mmengine 0.10.7 reads
    under torch >= 2.6 only with mmevo's checkpoint allowlist: the config
    opts in through its ``custom_imports``."""
    import mmpretrain

    tool = osp.join(
        osp.dirname(mmpretrain.__file__), '.mim', 'tools', 'train.py'
    )
    cfg = _small_config(tmp_path, DEMO_CLS, tiny_imagenet, OPT_IN_FIXES)
    image = osp.join(tiny_imagenet, 'val', CLS_CLASSES[4], '000004.png')
    out = subprocess.run(
        [
            sys.executable,
            '-c',
            MMPRETRAIN_PATH,
            cfg,
            str(tmp_path / 'work'),
            image,
        ],
        cwd=str(tmp_path),  # not the repository: mmevo comes from the venv
        env=dict(os.environ, PYTHONPATH=REPO),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    ran = 'RAN ' + (tool if osp.isfile(tool) else 'Runner.from_cfg')
    assert ran in out.stdout
    assert (tmp_path / 'work' / 'epoch_1.pth').is_file()
    # the tool validated after the epoch with mmpretrain's Accuracy
    assert 'accuracy/top1' in out.stdout + out.stderr
    label = out.stdout.split('PREDICTED')[-1].split()
    assert label[0] in CLS_CLASSES and 0 <= int(label[1]) < 10


def _official_format_checkpoint(path, drop=None):
    """A RedNet-50 ImageNet classifier saved as the mmcls releases are:
    ``state_dict`` (backbone.*, head.fc.*) and ``meta`` only."""
    from mmengine.config import Config
    from mmengine.registry import DefaultScope
    from mmpretrain.registry import MODELS

    with DefaultScope.overwrite_default_scope('mmpretrain'):
        torch.manual_seed(0)
        model = MODELS.build(Config.fromfile(REDNET50).model)
    model.init_weights()
    state = model.state_dict()
    assert (
        'head.fc.weight' in state
        and 'backbone.stem.1.conv2.conv.weight' in state
    )
    if drop:
        del state[drop]
    torch.save(dict(meta=dict(mmcls_version='0.12.0'), state_dict=state), path)


def test_test_tool_takes_an_official_checkpoint(
    tiny_imagenet, tmp_path, capsys
):
    """tools/test.py runs the 1000-class ImageNet config on an mmcls-format
    checkpoint without --allow-partial; a checkpoint that lacks a key is
    refused in one line naming it."""
    cfg = _small_config(
        tmp_path,
        REDNET50,
        tiny_imagenet,
        'val_dataloader = dict(batch_size=4, num_workers=0, '
        'persistent_workers=False, dataset=dict(data_root=data_root, '
        f'metainfo=dict(classes={CLS_CLASSES!r})))\n'
        'test_dataloader = val_dataloader\n',
    )
    ckpt = str(tmp_path / 'rednet50_official.pth')
    _official_format_checkpoint(ckpt)
    metrics = load_tool('test').main(
        [cfg, ckpt, '--work-dir', str(tmp_path / 'test')]
    )
    assert 0 <= metrics['accuracy/top1'] <= 100
    assert 0 <= metrics['accuracy/top5'] <= 100
    bad = str(tmp_path / 'rednet50_no_fc.pth')
    _official_format_checkpoint(bad, drop='head.fc.bias')
    capsys.readouterr()
    with pytest.raises(SystemExit) as info:
        load_tool('test').main([cfg, bad, '--work-dir', str(tmp_path / 't2')])
    assert info.value.code == 1
    err = capsys.readouterr().err
    assert err.count('\n') == 1 and 'missing keys 1 (head.fc.bias)' in err
