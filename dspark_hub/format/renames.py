"""The two renames a writer's last step needs: take a name only while it is free, and swap two entries.

`os.rename` replaces whatever is at the destination, so "check, then rename" loses what another
process puts there in between. Linux's `renameat2` does both in one step (`RENAME_NOREPLACE`,
`RENAME_EXCHANGE`). Where it is missing (another system, an old C library) or the file system does
not take the flag, `rename_noreplace` falls back to a hard link for a file (atomic too) and to a
plain rename for a folder, which the kernel still refuses over anything but an empty folder; and
`exchange` says it could not, so the caller moves the old entry aside instead.
"""

from __future__ import annotations

import ctypes
import errno
import functools
import os
from collections.abc import Callable
from pathlib import Path

_AT_FDCWD = -100
_RENAME_NOREPLACE = 1
_RENAME_EXCHANGE = 2
#: errno values that mean "this system or file system cannot do it", not "the rename failed".
_UNSUPPORTED = {errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP, errno.ENOTSUP}
#: errno values a no-replace rename or link gives when something holds the name.
_TAKEN = {errno.EEXIST, errno.ENOTEMPTY, errno.ENOTDIR, errno.EISDIR}

Renameat2 = Callable[[int, bytes, int, bytes, int], int]


@functools.cache
def _renameat2() -> Renameat2 | None:
    """The C library's `renameat2`, or None where there is none."""
    try:
        function = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):
        return None
    function.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    function.restype = ctypes.c_int
    return function


def _call(src: Path, dst: Path, flags: int) -> bool:
    """renameat2(src, dst, flags): True when done, False when unsupported here; raises OSError otherwise."""
    function = _renameat2()
    if function is None:
        return False
    if function(_AT_FDCWD, os.fsencode(src), _AT_FDCWD, os.fsencode(dst), flags) == 0:
        return True
    code = ctypes.get_errno()
    if code in _UNSUPPORTED:
        return False
    raise OSError(code, os.strerror(code), str(src), None, str(dst))


def rename_noreplace(src: Path, dst: Path) -> None:
    """Rename `src` to `dst` only if nothing is at `dst` (a dangling link counts); never replaces anything.

    Raises:
        FileExistsError: something is at `dst` (it is left as it was, and `src` too).
        OSError: any other failure of the rename.
    """
    try:
        if _call(src, dst, _RENAME_NOREPLACE):
            return
        if os.path.lexists(dst):
            raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), str(dst))
        if os.path.isdir(src) and not os.path.islink(src):
            os.rename(src, dst)      # over anything but an empty folder the kernel refuses
            return
        try:
            os.link(src, dst, follow_symlinks=False)
        except OSError as e:
            if e.errno in _TAKEN:
                raise
            os.rename(src, dst)      # a file system without hard links: the check above is all there is
            return
        os.unlink(src)
    except FileExistsError:
        raise
    except OSError as e:
        if e.errno in _TAKEN:
            raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), str(dst)) from e
        raise


def exchange(a: Path, b: Path) -> bool:
    """Swap the entries `a` and `b` in one step (both must exist); False where the system cannot.

    Raises:
        OSError: the swap failed (e.g. one of them is gone).
    """
    return _call(a, b, _RENAME_EXCHANGE)
