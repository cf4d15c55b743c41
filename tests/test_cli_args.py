"""The tools' entry module: its argparse types make an out-of-range integer
or an unknown or absent device a one-line usage error that names what was
expected, and it hides mmengine's pkg_resources warning."""

import argparse
import subprocess
import sys

import pytest
import torch

from mmevo.cli import device_arg, int_in_range


def _parser(**kwargs):
    parser = argparse.ArgumentParser(prog='tool')
    parser.add_argument('--x', **kwargs)
    return parser


@pytest.mark.parametrize(
    'text, message',
    [
        ('0', 'argument --x: expected an integer in [1, 8], got 0'),
        ('9', 'argument --x: expected an integer in [1, 8], got 9'),
        ('two', "argument --x: expected an integer, got 'two'"),
    ],
)
def test_int_in_range(text, message, capsys):
    with pytest.raises(SystemExit) as info:
        _parser(type=int_in_range(1, 8)).parse_args(['--x', text])
    assert info.value.code == 2
    assert (
        capsys.readouterr().err.splitlines()[-1] == f'tool: error: {message}'
    )
    assert _parser(type=int_in_range(1, 8)).parse_args(['--x', '8']).x == 8


def test_device_arg(capsys):
    assert _parser(type=device_arg).parse_args(
        ['--x', 'cpu']
    ).x == torch.device('cpu')
    with pytest.raises(SystemExit):
        _parser(type=device_arg).parse_args(['--x', 'garbage'])
    assert capsys.readouterr().err.splitlines()[-1] == (
        "tool: error: argument --x: expected a device such as 'cpu' or "
        "'cuda:0', got 'garbage'"
    )


@pytest.mark.skipif(torch.cuda.is_available(), reason='a GPU is present')
def test_device_arg_without_a_gpu(capsys):
    with pytest.raises(SystemExit):
        _parser(type=device_arg).parse_args(['--x', 'cuda'])
    assert capsys.readouterr().err.splitlines()[-1] == (
        'tool: error: argument --x: expected an available device, got '
        "'cuda': no CUDA device"
    )


_WARNS = (
    'import warnings; warnings.simplefilter("default"); {}'
    'from mmengine.utils import is_installed; is_installed("torch")'
)


@pytest.mark.parametrize('entry', ['', 'import mmevo.cli; '])
def test_entry_hides_the_pkg_resources_warning(entry):
    """mmengine's ``is_installed`` (the config loader's, for ``mmdet::``
    bases) warns through pkg_resources unless the tools' entry is
    imported."""
    out = subprocess.run(
        [sys.executable, '-c', _WARNS.format(entry)],
        capture_output=True,
        text=True,
        check=True,
    )
    assert ('pkg_resources is deprecated' in out.stderr) == (not entry)
