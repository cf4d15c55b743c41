"""tools/test.py --out: an output that is one of the inputs (the checkpoint,
through a symlink too, or the config) or cannot be written is refused in
one line before the checkpoint is read and the evaluation runs, and the
input is kept."""

import pytest
import torch

from mmevo import apis

from tool_utils import DEMO_DET, load_tool


@pytest.fixture
def no_evaluation(monkeypatch):
    def ran(*args, **kwargs):
        raise AssertionError('the evaluation started')

    monkeypatch.setattr(apis, 'read_checkpoint', ran)
    monkeypatch.setattr(apis, 'build_runner', ran)


def refused(capsys, argv):
    with pytest.raises(SystemExit) as info:
        load_tool('test').main(argv)
    assert info.value.code == 1
    err = capsys.readouterr().err
    assert err.startswith('error: ') and err.count('\n') == 1, err
    return err[len('error: ') : -1]


def test_out_that_is_an_input_is_refused(tmp_path, capsys, no_evaluation):
    ckpt = tmp_path / 'ck.pkl'  # --out must end with .pkl
    torch.save(dict(state_dict={}), ckpt)
    before = ckpt.read_bytes()
    link = tmp_path / 'link.pkl'
    link.symlink_to(ckpt)
    for out in (ckpt, link):
        assert refused(capsys, [DEMO_DET, str(ckpt), '--out', str(out)]) == (
            f"--out '{out}' is the checkpoint '{ckpt}': the tool would "
            'write over its own input; choose another output file'
        )
    assert ckpt.read_bytes() == before


def test_out_that_cannot_be_written_is_refused_first(
    tmp_path, capsys, no_evaluation
):
    ckpt = str(tmp_path / 'ck.pth')
    out = '/proc/mmevo/preds.pkl'
    message = refused(capsys, [DEMO_DET, ckpt, '--out', out])
    assert message.startswith(
        f"--out '{out}': cannot write in the folder '/proc' ("
    )
    assert message.endswith('); choose a writable output folder')
    under_a_file = f'{DEMO_DET}/preds.pkl'
    assert refused(capsys, [DEMO_DET, ckpt, '--out', under_a_file]) == (
        f"--out '{under_a_file}': '{DEMO_DET}' is a file, not a folder; "
        'choose another output folder'
    )
