"""What the command line does with bad input: one line (from rank 0 only),
an exit status, no traceback (a missing config, data set or pretrained
checkpoint, a corrupt, empty or malicious checkpoint or one that does not
fit the model, arguments out of bounds, an ONNX file of another model), and
launch scripts that pass paths with spaces through intact."""

import os
import stat
import subprocess
import sys

import pytest
import torch
from mmdet.registry import MODELS
from mmengine.config import Config
from mmengine.registry import init_default_scope

from mmevo.apis import check_data, one_line_errors

from tool_utils import DEMO_DET, REPO, load_tool

pytestmark = pytest.mark.slow

# The demo detector evaluated on the 4 validation images of tiny_coco.
TEST_CONFIG = """
_base_ = '{base}'
data_root = '{root}/'
test_dataloader = dict(
    batch_size=2, num_workers=0, persistent_workers=False,
    dataset=dict(data_root=data_root))
test_evaluator = dict(ann_file=data_root + 'annotations/instances_val.json')
"""


def _run_as_rank0(args, cwd):
    """Run a tool as a fresh, undistributed process (rank 0 prints)."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ('RANK', 'SLURM_PROCID')
    }
    return subprocess.run(
        args,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
        env=dict(env, PYTHONPATH=REPO),
    )


@pytest.mark.parametrize('tool', ['train', 'test'])
def test_missing_config_is_one_line(tool, tmp_path, capsys):
    argv = ['x.py'] + (['model.pth'] if tool == 'test' else [])
    with pytest.raises(SystemExit) as info:
        load_tool(tool).main(argv)
    assert info.value.code == 2
    assert (
        capsys.readouterr().err == "error: config file 'x.py' does not exist\n"
    )


@pytest.mark.parametrize('rank', ['0', '1'])
def test_exit_prints_one_line_on_rank_zero(
    tmp_path, capsys, monkeypatch, rank
):
    monkeypatch.setenv('RANK', rank)
    cfg = Config(
        dict(
            train_dataloader=dict(
                dataset=dict(
                    type='CocoDataset', data_root=str(tmp_path / 'none/')
                )
            )
        )
    )
    with pytest.raises(SystemExit) as info, one_line_errors():
        check_data(cfg, ['train_dataloader'])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err.count('\n') == (1 if rank == '0' else 0)
    if rank == '0':
        assert err.startswith("error: train_dataloader: data_root '")


@pytest.mark.parametrize('tool', ['train', 'test'])
def test_tools_stop_without_a_trace(tool, tmp_path):
    loader = f'{tool}_dataloader'
    args = [
        sys.executable,
        os.path.join(REPO, 'tools', f'{tool}.py'),
        DEMO_DET,
    ]
    if tool == 'test':  # a checkpoint is there, the data is not
        torch.save({}, tmp_path / 'model.pth')
        args.append(str(tmp_path / 'model.pth'))
    # run from an empty directory: the relative data root is missing there
    out = _run_as_rank0(args, tmp_path)
    assert out.returncode == 2
    assert 'Traceback' not in out.stderr
    assert out.stderr.strip() == (
        f"error: {loader}: data_root 'data/synthetic_coco/' does not exist; "
        'generate it with `python tools/misc/make_synthetic_data.py det`, '
        'or point the config at your copy with --cfg-options '
        f'{loader}.dataset.data_root=PATH'
    )
    assert not (tmp_path / 'work_dirs').exists()


def test_train_stops_on_missing_pretrained_checkpoint(tmp_path):
    """COCO is there (as far as paths go), the ImageNet checkpoint is not."""
    root = tmp_path / 'coco'
    for d in ('annotations', 'train2017', 'val2017'):
        (root / d).mkdir(parents=True)
    for f in ('instances_train2017.json', 'instances_val2017.json'):
        (root / 'annotations' / f).write_text('{}')
    config = os.path.join(REPO, 'configs', 'rednet50_fpn_coco.py')
    out = _run_as_rank0(
        [
            sys.executable,
            os.path.join(REPO, 'tools', 'train.py'),
            config,
            '--cfg-options',
            f'train_dataloader.dataset.data_root={root}/',
            f'val_dataloader.dataset.data_root={root}/',
        ],
        tmp_path,
    )
    assert out.returncode == 2, out.stderr[-2000:]
    assert 'Traceback' not in out.stderr
    assert out.stderr.strip().startswith(
        'error: model.backbone.init_cfg.checkpoint '
        "'checkpoints/rednet50_imagenet.pth' does not exist;"
    )


def _mismatched_checkpoint(path):
    """A checkpoint of the demo detector with one key dropped, one added and
    one of another shape."""
    cfg = Config.fromfile(DEMO_DET)
    init_default_scope('mmdet')
    state = MODELS.build(cfg.model).state_dict()
    del state['bbox_head.retina_cls.bias']
    state['bbox_head.extra.weight'] = torch.zeros(3)
    state['neck.fpn_convs.0.conv.weight'] = torch.zeros(64, 64, 1, 1)
    torch.save(dict(meta={}, state_dict=state), path)


def test_checkpoint_that_does_not_fit_is_refused(tiny_coco, tmp_path, capsys):
    cfg = tmp_path / 'cfg.py'
    cfg.write_text(TEST_CONFIG.format(base=DEMO_DET, root=tiny_coco))
    ckpt = str(tmp_path / 'other.pth')
    _mismatched_checkpoint(ckpt)
    argv = [
        str(cfg),
        ckpt,
        '--work-dir',
        str(tmp_path / 'work'),
        '--cfg-options',
        'experiment_name=strict',
        'visualizer.name=strict',
    ]
    with pytest.raises(SystemExit) as info:
        load_tool('test').main(argv)
    assert info.value.code == 1
    err = capsys.readouterr().err
    assert 'Traceback' not in err and err.count('\n') == 1
    assert err == (
        f"error: checkpoint '{ckpt}' does not fit the model: missing keys 1 "
        '(bbox_head.retina_cls.bias); unexpected keys 1 '
        '(bbox_head.extra.weight); mis-shaped keys 1 '
        '(neck.fpn_convs.0.conv.weight (checkpoint (64, 64, 1, 1), model '
        '(64, 64, 3, 3))); evaluate it anyway with --allow-partial\n'
    )

    argv[-2:] = ['experiment_name=partial', 'visualizer.name=partial']
    metrics = load_tool('test').main([*argv, '--allow-partial'])
    assert 0 <= metrics['coco/bbox_mAP'] <= 1


def test_corrupt_checkpoint_is_one_line(tmp_path, capsys):
    ckpt = tmp_path / 'model.pth'
    ckpt.write_bytes(b'PK\x03\x04 not a whole zip file')
    with pytest.raises(SystemExit) as info:
        load_tool('test').main([DEMO_DET, str(ckpt)])
    assert info.value.code == 1
    assert capsys.readouterr().err.startswith(
        f"error: checkpoint '{ckpt}' cannot be loaded: truncated"
    )


# stands in for python (dist_*.sh) or srun (slurm_*.sh): writes its
# arguments, one per line, to $ARGV_OUT
FAKE = """#!/bin/sh
for a in "$@"; do printf '%s\\n' "$a"; done > "$ARGV_OUT"
"""


@pytest.mark.parametrize(
    'script',
    ['dist_train.sh', 'dist_test.sh', 'slurm_train.sh', 'slurm_test.sh'],
)
def test_launch_scripts_keep_paths_with_spaces(script, tmp_path):
    fake = tmp_path / 'bin' / ('srun' if 'slurm' in script else 'python')
    fake.parent.mkdir()
    fake.write_text(FAKE)
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    config = str(tmp_path / 'dir with space' / 'cfg.py')
    work_dir = str(tmp_path / 'work dir')
    ckpt = str(tmp_path / 'my ckpt.pth')
    tool = 'train' if 'train' in script else 'test'
    extra = ['--cfg-options', 'experiment_name=a b', '--out', 'x y.pkl']
    head = {
        'dist_train.sh': [config, '2'],
        'dist_test.sh': [config, ckpt, '2'],
        'slurm_train.sh': ['part', 'job', config, work_dir],
        'slurm_test.sh': ['part', 'job', config, ckpt],
    }[script]
    env = dict(
        os.environ,
        ARGV_OUT=str(tmp_path / 'argv'),
        PATH=f'{fake.parent}:{os.environ["PATH"]}',
        PYTHON=str(fake),
        SRUN_ARGS='--mem=1G --exclusive',
    )
    subprocess.run(
        [os.path.join(REPO, 'tools', script), *head, *extra],
        env=env,
        check=True,
        timeout=60,
        capture_output=True,
    )
    argv = (tmp_path / 'argv').read_text().splitlines()
    script_path = os.path.join(REPO, 'tools', f'{tool}.py')
    rest = argv[argv.index(script_path) + 1 :]
    if script.startswith('dist'):
        assert argv[:2] == ['-m', 'torch.distributed.run']
        assert '--nproc_per_node=2' in argv
        expected = [*head[:-1], '--launcher', 'pytorch', *extra]
    else:
        assert argv[argv.index(script_path) - 2 :][:2] == [str(fake), '-u']
        assert '--mem=1G' in argv and '--exclusive' in argv
        expected = (
            [config]
            + ([f'--work-dir={work_dir}'] if tool == 'train' else [ckpt])
            + ['--launcher=slurm']
            + extra
        )
    assert rest == expected


class _Payload:
    def __reduce__(self):
        return (print, ('arbitrary code ran',))


def _bad_checkpoint(path, kind):
    if kind == 'empty':
        path.write_bytes(b'')
        return 'the file is empty (0 bytes)'
    torch.save(dict(state_dict={}, x=_Payload()), path)
    return 'refused by the weights-only load: '


@pytest.mark.parametrize('kind', ['empty', 'malicious'])
@pytest.mark.parametrize(
    'tool',
    ['test', 'train', 'deployment/pytorch2onnx', 'analysis/visualize_kernels'],
)
def test_what_is_no_checkpoint_is_one_line(tool, kind, tmp_path, capsys):
    ckpt = tmp_path / 'model.pth'
    reason = _bad_checkpoint(ckpt, kind)
    argv = {
        'test': [DEMO_DET, str(ckpt)],
        'train': [DEMO_DET, '--resume', str(ckpt)],
        'deployment/pytorch2onnx': [
            DEMO_DET,
            str(ckpt),
            '--out',
            str(tmp_path / 'x.onnx'),
        ],
        'analysis/visualize_kernels': [
            DEMO_DET,
            str(ckpt),
            'x.jpg',
            '--list-layers',
        ],
    }[tool]
    with pytest.raises(SystemExit) as info:
        load_tool(tool).main(argv)
    assert info.value.code == 1
    err = capsys.readouterr().err
    what = '--resume checkpoint' if tool == 'train' else 'checkpoint'
    assert err.count('\n') == 1 and err.startswith(
        f"error: {what} '{ckpt}' cannot be loaded: {reason}"
    )
    assert 'arbitrary code ran' not in capsys.readouterr().out
    assert not (tmp_path / 'x.onnx').exists()


def test_a_state_dict_of_floats_is_refused(tiny_coco, tmp_path, capsys):
    cfg = tmp_path / 'cfg.py'
    cfg.write_text(TEST_CONFIG.format(base=DEMO_DET, root=tiny_coco))
    init_default_scope('mmdet')
    keys = MODELS.build(Config.fromfile(DEMO_DET).model).state_dict()
    ckpt = str(tmp_path / 'floats.pth')
    torch.save(dict(meta={}, state_dict={k: 0.0 for k in keys}), ckpt)
    with pytest.raises(SystemExit) as info:
        load_tool('test').main(
            [
                str(cfg),
                ckpt,
                '--work-dir',
                str(tmp_path / 'work'),
                '--cfg-options',
                'experiment_name=floats',
                'visualizer.name=floats',
            ]
        )
    assert info.value.code == 1
    err = capsys.readouterr().err
    assert err.count('\n') == 1 and err.startswith(
        f"error: checkpoint '{ckpt}' does not fit the model: mis-shaped "
        f'keys {len(keys)} ('
    )
    assert 'checkpoint float, model (' in err


def test_a_legacy_format_checkpoint_is_evaluated(tiny_coco, tmp_path):
    cfg = tmp_path / 'cfg.py'
    cfg.write_text(TEST_CONFIG.format(base=DEMO_DET, root=tiny_coco))
    init_default_scope('mmdet')
    state = MODELS.build(Config.fromfile(DEMO_DET).model).state_dict()
    ckpt = str(tmp_path / 'legacy.pth')
    torch.save(
        dict(meta={}, state_dict=state),
        ckpt,
        _use_new_zipfile_serialization=False,
    )
    metrics = load_tool('test').main(
        [
            str(cfg),
            ckpt,
            '--work-dir',
            str(tmp_path / 'work'),
            '--cfg-options',
            'experiment_name=legacy',
            'visualizer.name=legacy',
        ]
    )
    assert 0 <= metrics['coco/bbox_mAP'] <= 1


@pytest.mark.parametrize(
    'tool, args, message',
    [
        (
            'analysis/get_flops',
            ['--shape', '0', '0'],
            'argument --shape: expected an integer in [1, 8192], got 0',
        ),
        (
            'analysis/get_flops',
            ['--shape', '20000', '20000'],
            'argument --shape: expected an integer in [1, 8192], got 20000',
        ),
        (
            'deployment/pytorch2onnx',
            ['x.pth', '--out', 'x.onnx', '--shape', '0', '0'],
            'argument --shape: expected an integer in [1, 8192], got 0',
        ),
        (
            'deployment/pytorch2onnx',
            ['x.pth', '--out', 'x.onnx', '--shape', '20000', '20000'],
            'argument --shape: expected an integer in [1, 8192], got 20000',
        ),
        (
            'analysis/benchmark_backbones',
            ['--iters', '0'],
            'argument --iters: expected an integer >= 1, got 0',
        ),
        (
            'analysis/benchmark_backbones',
            ['--batch', '0'],
            'argument --batch: expected an integer in [1, 1024], got 0',
        ),
        (
            'analysis/benchmark_onnx',
            ['--iters', '0'],
            'argument --iters: expected an integer >= 1, got 0',
        ),
        (
            'analysis/benchmark_ops',
            ['--repeat', '0'],
            'argument --repeat: expected an integer >= 1, got 0',
        ),
        (
            'analysis/benchmark_ops',
            ['--peak-gbps', '0'],
            'argument --peak-gbps: expected a number > 0, got 0',
        ),
        (
            'analysis/benchmark_ops',
            ['--device', 'garbage'],
            "argument --device: expected a device such as 'cpu' or 'cuda:0', "
            "got 'garbage'",
        ),
        (
            'analysis/visualize_kernels',
            ['x.pth', 'x.jpg', '--list-layers', '--max-groups', '0'],
            'argument --max-groups: expected an integer >= 1, got 0',
        ),
        (
            'analysis/visualize_kernels',
            [
                'x.pth',
                'x.jpg',
                '--layer',
                'backbone.x',
                '--points',
                *['1,1'] * 65,
            ],
            'argument --points: expected at most 64 points, got 65',
        ),
    ],
)
def test_arguments_out_of_bounds_are_one_line(tool, args, message, tmp_path):
    """Refused by the parser, before any model is built (a subprocess: the
    benchmark tools parse sys.argv)."""
    head = [] if tool.startswith(('analysis/bench',)) else [DEMO_DET]
    out = _run_as_rank0(
        [
            sys.executable,
            os.path.join(REPO, 'tools', f'{tool}.py'),
            *head,
            *args,
        ],
        tmp_path,
    )
    assert out.returncode == 2
    assert 'Traceback' not in out.stderr
    assert out.stderr.splitlines()[-1].endswith(f'error: {message}')
    assert not os.listdir(tmp_path)


def test_onnx_model_of_another_kind_is_one_line(tiny_coco, tmp_path, capsys):
    import onnx
    from onnx import TensorProto, helper

    cfg = tmp_path / 'cfg.py'
    cfg.write_text(TEST_CONFIG.format(base=DEMO_DET, root=tiny_coco))
    # one output (a segmentor's), where the demo detector gives 2 per level
    graph = helper.make_graph(
        [helper.make_node('Identity', ['input'], ['logits'])],
        'seg',
        [
            helper.make_tensor_value_info(
                'input', TensorProto.FLOAT, [1, 3, 128, 128]
            )
        ],
        [
            helper.make_tensor_value_info(
                'logits', TensorProto.FLOAT, [1, 3, 128, 128]
            )
        ],
    )
    path = str(tmp_path / 'seg.onnx')
    # the IR and opset of the exporter's models: this onnx's default IR may
    # be newer than onnxruntime reads
    onnx.save(
        helper.make_model(
            graph, ir_version=8, opset_imports=[helper.make_opsetid('', 18)]
        ),
        path,
    )
    with pytest.raises(SystemExit) as info:
        load_tool('deployment/onnx_test').main(
            [
                str(cfg),
                path,
                '--work-dir',
                str(tmp_path / 'work'),
                '--cfg-options',
                'experiment_name=onnx1',
                'visualizer.name=onnx1',
            ]
        )
    assert info.value.code == 1
    err = capsys.readouterr().err
    assert err == (
        f"error: ONNX model '{path}' has 1 outputs, the config's det model "
        'gives 6 or 9: export this config with '
        'tools/deployment/pytorch2onnx.py\n'
    )
