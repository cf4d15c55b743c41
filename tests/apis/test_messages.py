"""mmevo.apis on the inputs a script gives: one dataloader name or several,
``pathlib.Path`` everywhere a path goes, a config file name where a Config
goes, and checkpoint names: a binary ``last_checkpoint`` is skipped with a
warning, a ``file://`` URL reads the file, an unknown ``open-mmlab://``
name is one line naming it."""

import os.path as osp
import pathlib
import warnings

import pytest
import torch

from mmevo import apis
from mmevo.datasets import MissingDataError

DEMO_DET = osp.join(
    osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__)))),
    'configs/demo/retinanet_rednet26-tiny_fpn_1xb8-20e_synthetic-coco.py',
)


@pytest.fixture(scope='module')
def demo(tmp_path_factory):
    """The demo detector's config, model and checkpoint."""
    cfg = apis.load_config(DEMO_DET)
    model = apis.build_model(cfg)
    path = tmp_path_factory.mktemp('demo') / 'c.pth'
    torch.save(dict(state_dict=model.state_dict()), path)
    return cfg, model, path


def test_check_data_takes_one_name_or_several(tmp_path):
    cfg = apis.load_config(DEMO_DET)
    cfg.test_dataloader.dataset.data_root = str(tmp_path / 'none') + '/'
    for names in (
        'test_dataloader',
        ['test_dataloader'],
        ('test_dataloader',),
    ):
        with pytest.raises(
            MissingDataError, match=r'^test_dataloader: data_root'
        ):
            apis.check_data(cfg, names)


def test_paths_may_be_pathlib(demo, tmp_path):
    cfg, model, path = demo
    path = pathlib.Path(path)
    loaded = apis.load_config(pathlib.Path(DEMO_DET), work_dir=tmp_path)
    assert loaded.work_dir == str(tmp_path)
    assert loaded.model == apis.load_config(DEMO_DET).model
    assert set(apis.read_checkpoint(path)) == {'state_dict'}
    assert apis.check_checkpoint_fits(model, path)['state_dict']
    built = apis.build_model(cfg, path)
    for k, v in built.state_dict().items():
        assert torch.equal(v, model.state_dict()[k]), k
    out = tmp_path / 'preds.pkl'
    apis.dump_results(cfg, out)
    assert cfg.test_evaluator[-1]['out_file_path'] == str(out)
    with pytest.raises(apis.CheckpointError, match=r"'.*none\.pth' does not"):
        apis.read_checkpoint(tmp_path / 'none.pth')


def test_build_model_takes_a_config_file(demo):
    _, model, path = demo
    built = apis.build_model(pathlib.Path(DEMO_DET), str(path))
    assert type(built) is type(model)
    assert apis.build_model(DEMO_DET).training is False
    with pytest.raises(TypeError) as info:
        apis.build_model(42)
    assert str(info.value) == (
        'build_model: cfg must be an mmengine Config (load_config) or a '
        'config file name, got int'
    )
    with pytest.raises(MissingDataError, match=r"config file 'none\.py'"):
        apis.build_model('none.py')


def test_a_binary_last_checkpoint_is_skipped_with_a_warning(tmp_path):
    torch.save(dict(state_dict={}), tmp_path / 'epoch_2.pth')
    pointer = tmp_path / 'last_checkpoint'
    for content in (b'\x80\x02\xff\xfe garbage', b'\x00\x00\x00\x00'):
        pointer.write_bytes(content)
        with pytest.warns(UserWarning) as record:
            found = apis.find_resumable_checkpoint(str(tmp_path))
        assert found == str(tmp_path / 'epoch_2.pth')
        assert [str(w.message) for w in record] == [
            f"'{pointer}' does not name a checkpoint (binary or several "
            'lines); skipped, trying the checkpoints of the work dir'
        ]
    # a sound pointer is taken, without a warning
    torch.save(dict(state_dict={}), tmp_path / 'epoch_1.pth')
    pointer.write_text(str(tmp_path / 'epoch_1.pth'))
    with warnings.catch_warnings():
        warnings.simplefilter('error')
        found = apis.find_resumable_checkpoint(str(tmp_path))
    assert found == str(tmp_path / 'epoch_1.pth')


def test_a_file_url_reads_the_file(tmp_path):
    path = tmp_path / 'a b.pth'
    torch.save(dict(state_dict=dict(w=torch.arange(3.0))), path)
    for url in (f'file://{path}', f'file://{str(path).replace(" ", "%20")}'):
        state = apis.read_checkpoint(url)['state_dict']
        assert torch.equal(state['w'], torch.arange(3.0))
    missing = tmp_path / 'none.pth'
    with pytest.raises(apis.CheckpointError) as info:
        apis.read_checkpoint(f'file://{missing}')
    assert str(info.value) == f"checkpoint '{missing}' does not exist"


@pytest.mark.parametrize('scheme', ['open-mmlab', 'openmmlab', 'torchvision'])
def test_an_unknown_zoo_name_is_one_line(scheme):
    with pytest.raises(apis.CheckpointError) as info:
        apis.read_checkpoint(f'{scheme}://unknown_net', 'pretrained')
    assert str(info.value) == (
        f"pretrained '{scheme}://unknown_net' cannot be loaded: mmengine's "
        f"{scheme}:// model zoo has no model 'unknown_net'; give a file or "
        'a URL'
    )
