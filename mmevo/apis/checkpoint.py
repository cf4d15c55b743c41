"""Checkpoints: is a file sound, which one to resume from, does it fit.

Every tool that loads weights goes through :func:`read_checkpoint` (a file
that is not a sound checkpoint, or holds pickled code that torch's
``weights_only`` load refuses, is a :class:`CheckpointError` with a one-line
message) and :func:`check_checkpoint_fits` (every entry of the model's state
must be in the checkpoint, a tensor of the same shape); ``--resume`` also
checks the optimizer state (:mod:`.resume`).
"""

import os
import os.path as osp
import pickle
import re
import warnings
import zipfile

import torch
from mmengine.model import is_model_wrapper
from mmengine.runner import CheckpointLoader

from .outputs import local_path

# keys listed per kind in a mismatch message (then: "... and N more")
_MAX_KEYS = 10


class CheckpointError(ValueError):
    """A checkpoint cannot be loaded, or does not fit (one-line message)."""


def _first_line(error):
    """The line of a (torch, pickle) error message that says what failed."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    for line in lines:  # weights_only names the refused global on its own
        if 'GLOBAL' in line or 'Unsupported' in line:
            # (not its advice to allowlist what may be malicious)
            return line.split('. Please use')[0]
    return lines[0] if lines else type(error).__name__


def checkpoint_error(path):
    """Why the local checkpoint file ``path`` is not sound, or ``None``.

    A zip checkpoint (``torch.save``'s format) is read through, every
    member's CRC checked, nothing unpickled, so a truncated file is found
    before torch fails with "failed finding central directory". A legacy
    file (``_use_new_zipfile_serialization=False``) has no checksums: it is
    loaded with ``weights_only=True``.

    Args:
        path (str): A local file.

    Returns:
        str | None: A short reason, or ``None`` when the file is sound.

    Example:
        >>> checkpoint_error('work_dirs/demo/epoch_20.pth') is None
        True
    """
    if not osp.isfile(path):
        return 'no such file'
    if osp.getsize(path) == 0:
        return 'the file is empty (0 bytes)'
    try:
        with zipfile.ZipFile(path) as archive:
            bad = archive.testzip()
    except (zipfile.BadZipFile, OSError, EOFError) as e:
        with open(path, 'rb') as f:
            # a pickle (torch's default protocol 2, or one chosen with
            # torch.save's pickle_protocol): the legacy format
            head = f.read(2)
        legacy = head[:1] == b'\x80' and head[1:] in (
            b'\x02',
            b'\x03',
            b'\x04',
            b'\x05',
        )
        if not legacy:
            return f'truncated or not a torch checkpoint ({e})'
        try:
            torch.load(path, map_location='cpu', weights_only=True)
        except pickle.UnpicklingError as e:
            return f'refused by the weights-only load: {_first_line(e)}'
        except Exception as e:  # a truncated pickle: any
            return f'truncated legacy torch file ({_first_line(e)})'
        return None
    if bad is not None:
        return f'corrupt member {bad}'
    return None


def read_checkpoint(path, what='checkpoint', map_location='cpu'):
    """The checkpoint at ``path`` (a file or a URL), loaded weights-only.

    Args:
        path (str | Path): A local file (or its ``file://`` URL), a URL or
            a model zoo name (``open-mmlab://``, ``torchvision://``).
        what (str): What the messages call it. Default: 'checkpoint'.
        map_location (str): As ``torch.load``'s. Default: 'cpu'.

    Returns:
        dict: The checkpoint.

    Raises:
        CheckpointError: It does not exist, is not sound, holds pickled
            code, or is not a dict; a zoo name that mmengine does not know.

    Example:
        >>> state = read_checkpoint('work_dirs/demo/epoch_20.pth')
    """
    path = os.fspath(path)
    local = local_path(path)
    if local is not None:
        path = local
        reason = checkpoint_error(path)
        if reason == 'no such file':
            raise CheckpointError(f"{what} '{path}' does not exist")
        if reason is not None:
            raise CheckpointError(
                f"{what} '{path}' cannot be loaded: {reason}"
            )
    try:
        checkpoint = CheckpointLoader.load_checkpoint(
            path, map_location=map_location, logger='silent'
        )
    except pickle.UnpicklingError as e:
        raise CheckpointError(
            f"{what} '{path}' cannot be loaded: refused by the weights-only "
            f'load: {_first_line(e)}'
        ) from None
    except KeyError as e:
        if local is not None:  # only a zoo scheme's table lookup
            raise
        scheme = path.split('://', 1)[0]
        raise CheckpointError(
            f"{what} '{path}' cannot be loaded: mmengine's {scheme}:// "
            f'model zoo has no model {e.args[0]!r}; give a file or a URL'
        ) from None
    except (OSError, RuntimeError, EOFError) as e:
        raise CheckpointError(
            f"{what} '{path}' cannot be loaded: {_first_line(e)}"
        ) from None
    if not isinstance(checkpoint, dict):
        raise CheckpointError(
            f"{what} '{path}' is not a checkpoint: it holds a "
            f'{type(checkpoint).__name__}, not a dict'
        )
    return checkpoint


def _checkpoint_step(name):
    """The epoch or iteration number of 'epoch_N.pth' / 'iter_N.pth'."""
    match = re.fullmatch(r'(?:epoch|iter)_(\d+)\.pth', name)
    return int(match.group(1)) if match else None


def _read_pointer(pointer):
    """The path ``last_checkpoint`` names, or '' (with a warning) when it
    is not a text file naming one (a torn or overwritten pointer)."""
    with open(pointer, 'rb') as f:
        data = f.read()
    try:
        last = data.decode('utf-8').strip()
    except UnicodeDecodeError:
        last = None
    if last is None or '\x00' in last or '\n' in last:
        warnings.warn(
            f"'{pointer}' does not name a checkpoint (binary or several "
            'lines); skipped, trying the checkpoints of the work dir',
            stacklevel=3,
        )
        return ''
    return last


def find_resumable_checkpoint(work_dir):
    """The newest sound checkpoint of ``work_dir`` to resume from, or None.

    Starts from the one ``last_checkpoint`` names (what mmengine's automatic
    resume takes), then tries the other ``epoch_N.pth``/``iter_N.pth`` files
    from the highest N down. A corrupt or missing one is skipped with a
    warning.

    Args:
        work_dir (str): The work dir of the run.

    Returns:
        str | None: A checkpoint path; ``None`` when there is none.

    Example:
        >>> find_resumable_checkpoint('work_dirs/demo')
        'work_dirs/demo/epoch_20.pth'
    """
    candidates = []
    pointer = osp.join(work_dir, 'last_checkpoint')
    if osp.isfile(pointer):
        last = _read_pointer(pointer)
        if last:
            candidates.append(last)
    names = os.listdir(work_dir) if osp.isdir(work_dir) else []
    steps = [
        (_checkpoint_step(n), n)
        for n in names
        if _checkpoint_step(n) is not None
    ]
    candidates += [osp.join(work_dir, n) for _, n in sorted(steps)[::-1]]
    tried = set()
    for path in candidates:
        if path in tried:
            continue
        tried.add(path)
        reason = checkpoint_error(path)
        if reason is None:
            return path
        warnings.warn(
            f"cannot resume from '{path}': {reason}; trying an "
            'older checkpoint',
            stacklevel=2,
        )
    return None


def _describe(value):
    if isinstance(value, torch.Tensor):
        return str(tuple(value.shape))
    return type(value).__name__


def state_dict_mismatch(model, state_dict):
    """Entries of ``state_dict`` that do not fit ``model``.

    Compares as mmengine loads: a leading ``module.`` is dropped from the
    checkpoint's keys, and a wrapped model (DDP) is compared by its module.
    Every entry of the model's state must be in the checkpoint, a tensor of
    the same shape where the model has a tensor (else of the same type).

    Args:
        model (nn.Module): The model (or its wrapper).
        state_dict (dict): The checkpoint's ``state_dict`` (or the whole
            checkpoint when it has none).

    Returns:
        tuple[list[str], list[str], list[str]]: The missing keys, the
        unexpected keys and the mis-shaped ones, each described as
        ``'key (checkpoint (3, 4), model (3, 5))'`` (``float`` in place of a
        shape for an entry that is no tensor).

    Example:
        >>> missing, unexpected, misshaped = state_dict_mismatch(
        ...     model, torch.load('epoch_1.pth')['state_dict'])
    """
    if is_model_wrapper(model):
        model = model.module
    if not isinstance(state_dict, dict):
        raise CheckpointError(
            f'a state_dict is a dict, got {type(state_dict).__name__}'
        )
    state_dict = state_dict.get('state_dict', state_dict)
    if not isinstance(state_dict, dict):
        raise CheckpointError(
            f'a state_dict is a dict, got {type(state_dict).__name__}'
        )
    theirs = {
        re.sub(r'^module\.', '', str(k)): v for k, v in state_dict.items()
    }
    ours = model.state_dict()
    missing = [k for k in ours if k not in theirs]
    unexpected = [k for k in theirs if k not in ours]
    misshaped = []
    for k, v in ours.items():
        if k not in theirs:
            continue
        other = theirs[k]
        if isinstance(v, torch.Tensor):
            fits = isinstance(other, torch.Tensor) and other.shape == v.shape
        else:
            fits = type(other) is type(v)
        if not fits:
            misshaped.append(
                f'{k} (checkpoint {_describe(other)}, model {_describe(v)})'
            )
    return missing, unexpected, misshaped


def _list(keys):
    """'N (key, key, ...)', at most ``_MAX_KEYS`` of them named."""
    more = (
        f', ... and {len(keys) - _MAX_KEYS} more'
        if len(keys) > _MAX_KEYS
        else ''
    )
    return f'{len(keys)} ({", ".join(keys[:_MAX_KEYS])}{more})'


def _model_problems(model, checkpoint):
    missing, unexpected, misshaped = state_dict_mismatch(model, checkpoint)
    return [
        f'{what} keys {_list(keys)}'
        for what, keys in (
            ('missing', missing),
            ('unexpected', unexpected),
            ('mis-shaped', misshaped),
        )
        if keys
    ]


def check_checkpoint_fits(model, checkpoint, hint='', name=None):
    """Raise unless every entry of ``checkpoint`` fits ``model``.

    Args:
        model (nn.Module): The model (wrapped or not).
        checkpoint (str | Path | dict): The checkpoint's path or URL (read with
            :func:`read_checkpoint`), or the checkpoint itself.
        hint (str): What the user can do about a misfit, for the message.
        name (str, optional): The checkpoint's name in the message; default:
            its path.

    Returns:
        dict: The checkpoint.

    Raises:
        CheckpointError: One line: its missing, unexpected and mis-shaped
            keys, then ``hint``.

    Example:
        >>> check_checkpoint_fits(model, 'epoch_20.pth', 'use --allow-partial')
    """
    if isinstance(checkpoint, (str, os.PathLike)):
        name = name or os.fspath(checkpoint)
        checkpoint = read_checkpoint(checkpoint)
    problems = _model_problems(model, checkpoint)
    if problems:
        raise CheckpointError(
            f"checkpoint '{name or '(given)'}' does not fit the model: "
            f'{"; ".join(problems)}' + (f'; {hint}' if hint else '')
        )
    return checkpoint
