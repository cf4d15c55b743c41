"""The demos end to end, shortened: a few training iterations on a tiny
synthetic set, then the real evaluation (mmdet's CocoMetric, mmseg's
IoUMetric), and tools/test.py reproducing it from the saved checkpoint."""

import pickle

import pytest

from tool_utils import DEMO_DET, DEMO_SEG, load_tool

pytestmark = pytest.mark.slow

DET_CONFIG = """
_base_ = '{base}'
data_root = '{root}/'
train_dataloader = dict(
    batch_size=4, num_workers=0, persistent_workers=False,
    dataset=dict(data_root=data_root))
val_dataloader = dict(
    batch_size=2, num_workers=0, persistent_workers=False,
    dataset=dict(data_root=data_root))
test_dataloader = val_dataloader
val_evaluator = dict(ann_file=data_root + 'annotations/instances_val.json')
test_evaluator = val_evaluator
train_cfg = dict(max_epochs=1, val_interval=1)
# an untrained detector scores below the usual 0.05: keep every box so the
# COCO evaluation has detections to score
model = dict(test_cfg=dict(score_thr=0.0))
"""

SEG_CONFIG = """
_base_ = '{base}'
data_root = '{root}/'
train_dataloader = dict(
    batch_size=2, num_workers=0, persistent_workers=False,
    dataset=dict(data_root=data_root))
val_dataloader = dict(
    batch_size=2, num_workers=0, persistent_workers=False,
    dataset=dict(data_root=data_root))
test_dataloader = val_dataloader
train_cfg = dict(max_iters=2, val_interval=2)
default_hooks = dict(checkpoint=dict(interval=2))
"""


@pytest.mark.parametrize('kind', ['det', 'seg'])
def test_demo_train_then_test(kind, tiny_coco, tiny_cityscapes, tmp_path):
    if kind == 'det':
        text = DET_CONFIG.format(base=DEMO_DET, root=tiny_coco)
        metric, ckpt, num_val = 'coco/bbox_mAP', 'epoch_1.pth', 4
    else:
        text = SEG_CONFIG.format(base=DEMO_SEG, root=tiny_cityscapes)
        metric, ckpt, num_val = 'mIoU', 'iter_2.pth', 2
    cfg = tmp_path / 'cfg.py'
    cfg.write_text(text)
    name = f'demo_{kind}'
    runner = load_tool('train').main(
        [
            str(cfg),
            '--work-dir',
            str(tmp_path / 'work'),
            '--cfg-options',
            f'experiment_name={name}',
            f'visualizer.name={name}',
        ]
    )
    val_score = runner.message_hub.get_scalar(f'val/{metric}').current()
    assert 0 <= val_score <= 100

    out = tmp_path / 'preds.pkl'
    metrics = load_tool('test').main(
        [
            str(cfg),
            str(tmp_path / 'work' / ckpt),
            '--work-dir',
            str(tmp_path / 'test'),
            '--out',
            str(out),
            '--cfg-options',
            f'experiment_name={name}_test',
            f'visualizer.name={name}_test',
        ]
    )
    # the checkpoint holds the model that was validated after training
    assert metrics[metric] == pytest.approx(val_score)
    with open(out, 'rb') as f:
        assert len(pickle.load(f)) == num_val


@pytest.mark.parametrize('tool', ['train', 'test'])
def test_missing_checkpoint_is_one_line(tool, tmp_path, capsys):
    ckpt = str(tmp_path / 'nowhere.pth')
    argv = [DEMO_DET, ckpt] if tool == 'test' else [DEMO_DET, '--resume', ckpt]
    with pytest.raises(SystemExit) as info:
        load_tool(tool).main(argv)
    assert info.value.code == 1
    err = capsys.readouterr().err
    assert err.startswith('error: ') and err.count('\n') == 1
    assert f"'{ckpt}' does not exist" in err
