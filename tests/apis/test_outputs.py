"""Output paths (mmevo/apis/outputs.py): a tool's output that is one of its
inputs (the same name, a symlink, a hard link, a ``file://`` URL), a folder,
a device, a path under a file, or in a folder that cannot be written is
refused in one line naming the argument and the fix; a missing folder in a
writable one is fine (the write creates it)."""

import os

import pytest

from mmevo.apis import OutputPathError, check_output
from mmevo.apis.outputs import local_path


@pytest.fixture
def ckpt(tmp_path):
    path = tmp_path / 'c.pth'
    path.write_bytes(b'weights')
    return path


def test_an_output_that_is_an_input_is_refused(tmp_path, ckpt):
    link = tmp_path / 'link.pth'
    link.symlink_to(ckpt)
    hard = tmp_path / 'hard.pth'
    os.link(ckpt, hard)
    inputs = {'checkpoint': str(ckpt)}
    for out in (ckpt, link, hard, tmp_path / 'sub' / '..' / 'c.pth'):
        with pytest.raises(OutputPathError) as info:
            check_output(out, inputs)
        assert str(info.value) == (
            f"--out '{out}' is the checkpoint '{ckpt}': the tool would "
            'write over its own input; choose another output file'
        )
    # the input given as a symlink or a file:// URL is resolved too
    with pytest.raises(OutputPathError, match=f"is the config '{link}'"):
        check_output(ckpt, {'config': f'file://{link}'})
    with pytest.raises(OutputPathError, match=r"^dst '.*' is the source"):
        check_output(ckpt, {'source': str(link)}, what='dst')
    # another file beside it, an URL input, no inputs: fine
    assert check_output(tmp_path / 'd.pth', inputs) == str(tmp_path / 'd.pth')
    assert check_output(ckpt, {'checkpoint': 'https://x/c.pth'}) == str(ckpt)
    assert ckpt.read_bytes() == b'weights'


def test_what_is_no_writable_file_is_refused(tmp_path, ckpt):
    cases = {
        str(tmp_path): 'is a folder; give a file name in it',
        '/dev/full': 'is not a regular file (a device or a pipe)',
        str(ckpt / 'x.onnx'): f"'{ckpt}' is a file, not a folder",
        str(ckpt / 'a' / 'b' / 'x.onnx'): f"'{ckpt}' is a file, not a folder",
    }
    for out, reason in cases.items():
        with pytest.raises(OutputPathError) as info:
            check_output(out, what='--out')
        message = str(info.value)
        assert message.startswith(f"--out '{out}'") and reason in message
        assert '\n' not in message


def test_a_folder_that_cannot_be_written_is_refused():
    # /proc takes no new files, whoever runs the test (root included)
    with pytest.raises(OutputPathError) as info:
        check_output('/proc/mmevo/x.pth')
    assert str(info.value).startswith(
        "--out '/proc/mmevo/x.pth': cannot write in the folder '/proc' ("
    )
    assert str(info.value).endswith('); choose a writable output folder')


def test_a_missing_folder_is_fine_and_left_to_the_write(tmp_path):
    out = tmp_path / 'new' / 'deeper' / 'm.pt2'
    assert check_output(out, suffix='.pt2') == str(out)
    assert not (tmp_path / 'new').exists()  # nothing made before the work
    assert os.listdir(tmp_path) == []  # nor left from the probe


def test_a_wrong_suffix_says_which(tmp_path):
    with pytest.raises(OutputPathError) as info:
        check_output(tmp_path / 'x.pth', suffix='.pt2')
    assert str(info.value) == (
        f"--out '{tmp_path / 'x.pth'}' must end with .pt2 (e.g. x.pt2)"
    )


def test_local_path():
    assert local_path('file:///a%20b/c.pth') == '/a b/c.pth'
    assert local_path('https://x/c.pth') is None
    assert local_path('open-mmlab://resnet50') is None
    assert local_path('rel/c.pth') == 'rel/c.pth'
