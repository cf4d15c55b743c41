"""Where the tools write: an output path is checked before the work
(not one of the tool's inputs, a file in a folder that can be written) and
written atomically (:mod:`mmevo.integrations.mmengine.atomic_backend`)."""

import errno
import os
import os.path as osp
import tempfile
from urllib.parse import unquote, urlparse


class OutputPathError(ValueError):
    """An output path the tool cannot or must not write (one line)."""


def local_path(path):
    """``path`` as a local file name: a ``file://`` URL's path, ``None``
    for another URL (``https://``, ``open-mmlab://``), else ``path``.

    Example:
        >>> local_path('file:///data/c.pth'), local_path('https://x/c.pth')
        ('/data/c.pth', None)
    """
    path = os.fspath(path)
    if path.startswith('file://'):
        return unquote(urlparse(path).path)
    return None if '://' in path else path


def _same_file(a, b):
    if osp.realpath(a) == osp.realpath(b):
        return True
    try:  # hard links, bind mounts
        return osp.samefile(a, b)
    except OSError:
        return False


def _existing_ancestor(path):
    folder = osp.dirname(path)
    while not osp.lexists(folder):
        folder = osp.dirname(folder)
    return folder


def check_output(path, inputs=None, what='--out', suffix=None):
    """Raise unless the tool can write ``path``: before a long job, so
    that it fails in one line at once rather than after the work, and
    never writes over its own input.

    ``path`` must not be one of ``inputs`` (compared after resolving
    symlinks, and hard links), nor an existing folder or non-regular file
    (``/dev/full``); its folder must exist and be writable, or be
    creatable in a writable one (the write creates it).

    Args:
        path (str | Path): The output file.
        inputs (dict, optional): What the tool reads: ``{name: path}``,
            e.g. ``{'checkpoint': 'c.pth'}``; URLs other than ``file://``
            are skipped.
        what (str): The argument, for the message. Default: '--out'.
        suffix (str, optional): The extension the output must have.

    Returns:
        str: ``path`` (a ``str``).

    Raises:
        OutputPathError: One line naming ``what``, the path and the fix.

    Example:
        >>> check_output('c.pth', {'checkpoint': 'c.pth'})
        OutputPathError: --out 'c.pth' is the checkpoint 'c.pth': ...
    """
    path = os.fspath(path)
    for name, source in (inputs or {}).items():
        source = source if source is None else local_path(source)
        if source is not None and _same_file(path, source):
            raise OutputPathError(
                f"{what} '{path}' is the {name} '{source}': the tool would "
                'write over its own input; choose another output file'
            )
    if suffix is not None and not path.endswith(suffix):
        root = osp.splitext(osp.basename(path))[0] or 'out'
        raise OutputPathError(
            f"{what} '{path}' must end with {suffix} (e.g. {root}{suffix})"
        )
    if osp.isdir(path):
        raise OutputPathError(
            f"{what} '{path}' is a folder; give a file name in it"
        )
    if osp.exists(path) and not osp.isfile(path):
        raise OutputPathError(
            f"{what} '{path}' is not a regular file (a device or a pipe); "
            'give a file name'
        )
    folder = _existing_ancestor(osp.abspath(path))
    if not osp.isdir(folder):
        raise OutputPathError(
            f"{what} '{path}': '{folder}' is a file, not a folder; "
            'choose another output folder'
        )
    try:  # access() says yes to root and to ACL-less guesses: try it
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as e:
        reason = e.strerror or errno.errorcode.get(e.errno, str(e))
        raise OutputPathError(
            f"{what} '{path}': cannot write in the folder '{folder}' "
            f'({reason}); choose a writable output folder'
        ) from None
    return path
