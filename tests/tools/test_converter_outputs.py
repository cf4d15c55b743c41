"""tools/model_converters: a destination that is the source (or a link to
it) is refused and the source kept; a source that is no sound checkpoint,
or a destination that cannot be written, is one line naming the file; the
output is written atomically: a write that fails partway (a file size
limit, as a full disk) keeps the previous output and leaves no temporary
file, and two converters writing one destination at once leave one whole
output, never a torn one."""

import os
import resource
import subprocess
import sys
import time

import pytest
import torch

from tool_utils import REPO, load_tool

pytestmark = pytest.mark.slow  # subprocesses, each importing mmevo

FAMILIES = ['elsa', 'acmix']
MARK = dict(elsa='ghost_head', acmix='dep_conv')
TOOL = os.path.join(REPO, 'tools/model_converters/elsa_swin_to_mmpretrain.py')


def official(family, seed=0, size=8):
    """A small stand-in of an official classification checkpoint: the
    family's marking key and a head (what the conversion looks at)."""
    g = torch.Generator().manual_seed(seed)
    state = {
        f'layers.0.blocks.0.attn.{MARK[family]}.weight': torch.randn(
            size, size, generator=g
        ),
        'norm.weight': torch.randn(size, generator=g),
        'head.weight': torch.randn(3, size, generator=g),
        'head.bias': torch.randn(3, generator=g),
    }
    return dict(model=state, epoch=300)


def convert(family, argv):
    return load_tool(f'model_converters/{family}_swin_to_mmpretrain').main(
        argv
    )


def one_line_error(capsys, family, argv):
    with pytest.raises(SystemExit) as info:
        convert(family, argv)
    assert info.value.code == 1
    err = capsys.readouterr().err
    assert err.startswith('error: ') and err.count('\n') == 1, err
    return err[len('error: ') : -1]


@pytest.mark.parametrize('family', FAMILIES)
def test_dst_that_is_src_is_refused_and_src_kept(tmp_path, family, capsys):
    src = tmp_path / 'official.pth'
    torch.save(official(family), src)
    before = src.read_bytes()
    link = tmp_path / 'link.pth'
    link.symlink_to(src)
    for dst in (src, link):
        message = one_line_error(capsys, family, [str(src), str(dst)])
        assert message == (
            f"dst '{dst}' is the source checkpoint '{src}': the tool would "
            'write over its own input; choose another output file'
        )
    assert src.read_bytes() == before
    # converting through the link to another file works
    convert(family, [str(link), str(tmp_path / 'out.pth')])
    state = torch.load(tmp_path / 'out.pth')['state_dict']
    assert torch.equal(
        state['backbone.norm3.weight'],
        official(family)['model']['norm.weight'],
    )


class _Payload:
    def __reduce__(self):
        return (print, ('arbitrary code ran',))


def test_a_bad_source_is_one_line_naming_it(tmp_path, capsys):
    good = tmp_path / 'good.pth'
    torch.save(official('elsa'), good)
    cases = {
        'text.pth': (b'hello, world\n', 'truncated or not a torch checkpoint'),
        'empty.pth': (b'', 'the file is empty (0 bytes)'),
        'cut.pth': (good.read_bytes()[:300], 'truncated or not a torch'),
    }
    dst = str(tmp_path / 'out.pth')
    for name, (content, reason) in cases.items():
        (tmp_path / name).write_bytes(content)
        src = str(tmp_path / name)
        message = one_line_error(capsys, 'elsa', [src, dst])
        assert message.startswith(
            f"source checkpoint '{src}' cannot be loaded: {reason}"
        )
    evil = tmp_path / 'evil.pth'
    torch.save(dict(model={}, x=_Payload()), evil)
    message = one_line_error(capsys, 'elsa', [str(evil), dst])
    assert message.startswith(
        f"source checkpoint '{evil}' cannot be loaded: refused by the "
        'weights-only load'
    )
    assert 'allowlist' not in message and 'print' in message
    missing = str(tmp_path / 'none.pth')
    assert one_line_error(capsys, 'elsa', [missing, dst]) == (
        f"source checkpoint '{missing}' does not exist"
    )
    # the other family's checkpoint
    message = one_line_error(capsys, 'acmix', [str(good), dst])
    assert message == (
        f"source checkpoint '{good}' cannot be converted: not an official "
        'acmix-Swin checkpoint: no "dep_conv" key'
    )
    assert not os.path.exists(dst)


def test_a_dst_that_cannot_be_written_is_one_line(tmp_path, capsys):
    src = tmp_path / 'official.pth'
    torch.save(official('elsa'), src)
    under_a_file = str(src / 'out.pth')
    message = one_line_error(capsys, 'elsa', [str(src), under_a_file])
    assert message == (
        f"dst '{under_a_file}': '{src}' is a file, not a folder; choose "
        'another output folder'
    )
    message = one_line_error(capsys, 'elsa', [str(src), '/dev/full'])
    assert message.startswith("dst '/dev/full' is not a regular file")
    # /proc takes no new files, whoever runs the test (root included)
    message = one_line_error(capsys, 'elsa', [str(src), '/proc/x/out.pth'])
    assert message.startswith(
        "dst '/proc/x/out.pth': cannot write in the folder '/proc' ("
    )
    assert message.endswith('); choose a writable output folder')
    # a missing folder is created
    convert('elsa', [str(src), str(tmp_path / 'a' / 'b' / 'out.pth')])
    assert (tmp_path / 'a' / 'b' / 'out.pth').is_file()


def _run(argv, limit=None):
    def set_limit():
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return subprocess.Popen(
        [sys.executable, *argv],
        env=dict(os.environ, PYTHONPATH=REPO),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=set_limit if limit else None,
    )


def test_a_failed_write_keeps_the_previous_output(tmp_path):
    small, large = tmp_path / 'small.pth', tmp_path / 'large.pth'
    torch.save(official('elsa', size=8), small)
    torch.save(official('elsa', seed=1, size=400), large)  # 640 kB
    dst = tmp_path / 'out' / 'c.pth'
    out = _run([TOOL, str(small), str(dst)])
    assert out.wait(300) == 0, out.stderr.read()
    before = dst.read_bytes()
    # writes past 100 kB fail (EFBIG), as on a full disk
    out = _run([TOOL, str(large), str(dst)], limit=100_000)
    assert out.wait(300) == 1
    err = out.stderr.read()
    assert err == (
        f"error: dst '{dst}' could not be written (File too large); the "
        'previous file, if any, is kept\n'
    )
    assert dst.read_bytes() == before
    assert os.listdir(dst.parent) == ['c.pth']  # no temporary file left


# runs the converter tool `n` times, source to destination
_LOOP = """
import importlib.util, sys
tool, src, dst, n = sys.argv[1:]
spec = importlib.util.spec_from_file_location('converter', tool)
converter = importlib.util.module_from_spec(spec)
spec.loader.exec_module(converter)
for _ in range(int(n)):
    converter.main([src, dst])
"""


def test_two_converters_at_once_never_leave_a_torn_file(tmp_path):
    dst = tmp_path / 'c.pth'
    expected = []
    procs = []
    for seed in (1, 2):
        src = tmp_path / f'official{seed}.pth'
        torch.save(official('elsa', seed=seed, size=600), src)  # 1.4 MB
        expected.append(official('elsa', seed=seed, size=600)['model'])
        procs.append(_run(['-c', _LOOP, TOOL, str(src), str(dst), '15']))
    seen = 0
    # read the destination while both write it: always one whole output
    while any(p.poll() is None for p in procs):
        if not dst.exists():
            time.sleep(0.01)
            continue
        state = torch.load(dst, map_location='cpu')['state_dict']
        weight = state['backbone.norm3.weight']
        assert any(torch.equal(weight, e['norm.weight']) for e in expected)
        seen += 1
    for p in procs:
        assert p.wait() == 0, p.stderr.read()
    assert seen > 0
    assert sorted(os.listdir(tmp_path)) == [
        'c.pth',
        'official1.pth',
        'official2.pth',
    ]
