"""Writers: atomic outputs, a streaming safetensors writer, and `init` (a conforming checkpoint).

Every writer builds its output under a hidden temporary sibling and renames it into
place at the end, so an interrupted run leaves no partial output and never touches
its input. Existing outputs are replaced only with `force=True`.

The temporary sibling is named `.<name>.tmp-<pid>-<random>`. A run killed outright (`kill -9`)
cannot remove it; the next writer of the same output removes every such sibling whose process
is gone (`sweep_stale_temps`).
"""

from __future__ import annotations

import errno
import os
import re
import resource
import shutil
import struct
import tempfile
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

from dspark_hub.errors import DsparkError, RefusedOverwriteError, UsageError
from dspark_hub.format import contract
from dspark_hub.format.contract import TensorSpec
from dspark_hub.format.reader import read_header
from dspark_hub.format.tensorio import BytesLike, iter_range, tensor_files
from dspark_hub.progress import Progress

#: What native writers say when a write fails: safetensors (`I/O error: ... (os error 27)`), torch's zip writer
#: (`file write failed`, `unexpected pos 704 vs 598` when a write came up short).
_NATIVE_WRITE_FAILED = re.compile(r"os error (\d+)|file write failed|unexpected pos \d+ vs \d+")


def _why_short(path: Path) -> int:
    """The errno a write to `path` that came up short most likely met: a full disk, the process's file-size
    limit (RLIMIT_FSIZE), else a plain I/O error."""
    try:
        free = os.statvfs(path.parent if path.parent.exists() else ".").f_bavail
    except OSError:
        free = None
    if free == 0:
        return errno.ENOSPC
    return errno.EFBIG if resource.getrlimit(resource.RLIMIT_FSIZE)[0] != resource.RLIM_INFINITY else errno.EIO


def named_io_error(error: BaseException, path: str | os.PathLike[str]) -> OSError | None:
    """The `OSError` naming `path` that `error`, raised while writing `path`, stands for; None when it is not
    an I/O failure or already names its file. Python's own writes raise `OSError` without a file name (a full
    disk: `[Errno 28]`; the file-size limit, RLIMIT_FSIZE, SIGXFSZ being ignored: `[Errno 27] File too
    large`); safetensors and torch raise their own types, read here by their message."""
    if isinstance(error, DsparkError) or (isinstance(error, OSError) and error.filename is not None):
        return None
    if isinstance(error, OSError):
        code = error.errno or errno.EIO
    else:
        m = _NATIVE_WRITE_FAILED.search(str(error)) if isinstance(error, Exception) else None
        if m is None:
            return None
        code = int(m.group(1)) if m.group(1) else _why_short(Path(path))
    return OSError(code, os.strerror(code), os.fspath(path))


@contextmanager
def writing(path: str | os.PathLike[str]) -> Iterator[None]:
    """Run a write of `path`: an I/O failure inside it (Python's or a native writer's) is raised as an
    `OSError` naming `path`, so the one-line error says which file (`named_io_error`)."""
    try:
        yield
    except Exception as e:
        named = named_io_error(e, path)
        if named is None:
            raise
        raise named from None


def write_file(path: str | os.PathLike[str], data: bytes | str) -> None:
    """Write `data` (text as UTF-8) to `path`; a write that fails names `path` (`writing`)."""
    with writing(path), open(path, "wb") as f:
        f.write(data.encode("utf-8") if isinstance(data, str) else data)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def check_writable(dst: Path, *, force: bool) -> None:
    """Raise `RefusedOverwriteError` when `dst` exists and `force` is off."""
    if dst.exists() and not force:
        raise RefusedOverwriteError(str(dst))


def _refuse_enclosing(dst: Path) -> Path:
    """`dst` with its parent resolved; refuse `.`, a name ending in `..`, the current folder and its parents.

    Replacing the folder a shell is in (or one above it) would pull the working directory out
    from under the user, and a trailing `..` names a folder other than the one the name shows.
    """
    cwd = Path.cwd().resolve()
    if dst.name in ("", "..") or dst.resolve() == cwd or dst.resolve() in cwd.parents:
        raise UsageError(f"{dst}: is the current folder or a parent of it; writing there would replace the "
                         "folder you are in; pass a new folder name (e.g. out/draft)")
    return dst.parent.resolve() / dst.name


def _temp_prefix(dst: Path) -> str:
    return f".{dst.name}.tmp-{os.getpid()}-"


def _process_gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:      # alive, under another user
        return False
    return False


def sweep_stale_temps(dst: str | os.PathLike[str]) -> list[Path]:
    """Remove the temporary siblings of `dst` left by writers that were killed (their process is gone).

    Returns:
        The paths removed.
    """
    dst = Path(dst)
    pattern = re.compile(rf"\.{re.escape(dst.name)}\.tmp-(\d+)-[A-Za-z0-9_]{{8}}")
    try:
        names = os.listdir(dst.parent)
    except OSError:
        return []
    removed = []
    for name in names:
        match = pattern.fullmatch(name)
        if match and int(match.group(1)) != os.getpid() and _process_gone(int(match.group(1))):
            _remove(dst.parent / name)
            removed.append(dst.parent / name)
    return removed


@contextmanager
def atomic_dir(dst: str | os.PathLike[str], *, force: bool = False) -> Iterator[Path]:
    """Yield an empty temporary folder that becomes `dst` only if the block completes.

    Raises:
        UsageError: `dst` is (or ends in) `.` or `..`, the current folder or one of its parents.
        RefusedOverwriteError: `dst` exists and `force` is False.
    """
    dst = _refuse_enclosing(Path(dst))
    check_writable(dst, force=force)
    dst.parent.mkdir(parents=True, exist_ok=True)
    sweep_stale_temps(dst)
    tmp = Path(tempfile.mkdtemp(prefix=_temp_prefix(dst), dir=dst.parent))
    os.chmod(tmp, 0o777 & ~_umask())   # mkdtemp makes 0700; the result should look like any new folder
    try:
        with writing(dst):
            yield tmp
    except BaseException as e:
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(e, OSError) and isinstance(e.filename, str) and e.filename.startswith(str(tmp)):
            raise OSError(e.errno, e.strerror, str(dst) + e.filename[len(str(tmp)):]) from None  # the file it builds
        raise
    _replace(tmp, dst)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def _replace(tmp: Path, dst: Path) -> None:
    """Rename `tmp` to `dst`; on any failure remove `tmp` and leave the old `dst` where it was."""
    if not os.path.lexists(dst):
        try:
            os.rename(tmp, dst)
        except BaseException:
            _remove(tmp)
            raise
        return
    trash = dst.with_name(f".{dst.name}.old-{os.getpid()}")
    try:
        os.rename(dst, trash)
    except BaseException:
        _remove(tmp)
        raise
    try:
        os.rename(tmp, dst)
    except BaseException:
        _remove(tmp)
        try:
            os.rename(trash, dst)
        except OSError as e:
            raise DsparkError(f"{dst}: could not put the previous output back ({e.strerror}); it is at {trash}, "
                              "move it back by hand") from e
        raise
    _remove(trash)


@contextmanager
def atomic_path(dst: str | os.PathLike[str], *, force: bool = False) -> Iterator[Path]:
    """Yield a temporary sibling path of `dst`; it replaces `dst` only if the block completes.

    The result gets the permissions of any new file (0666 minus the umask), also when the block
    replaced the temporary file itself (safetensors `save_file` writes 0600).
    """
    dst = Path(dst)
    check_writable(dst, force=force)
    dst.parent.mkdir(parents=True, exist_ok=True)
    sweep_stale_temps(dst)
    fd, name = tempfile.mkstemp(prefix=_temp_prefix(dst), dir=dst.parent)
    os.close(fd)
    mode = 0o666 & ~_umask()
    os.chmod(name, mode)
    try:
        with writing(dst):
            yield Path(name)
        os.chmod(name, mode)
        os.replace(name, dst)
    except BaseException as e:
        Path(name).unlink(missing_ok=True)
        if isinstance(e, OSError) and e.filename == name:
            raise OSError(e.errno, e.strerror, str(dst)) from None     # the output, not its temporary name
        raise


@contextmanager
def atomic_file(dst: str | os.PathLike[str], *, force: bool = False, mode: str = "wb") -> Iterator[IO[Any]]:
    """Open a temporary sibling of `dst` for writing; rename it over `dst` on success."""
    with atomic_path(dst, force=force) as tmp, open(tmp, mode) as f:
        yield f


def write_safetensors(path: str | os.PathLike[str], specs: Iterable[TensorSpec],
                      chunks: Callable[[TensorSpec], Iterable[BytesLike]], *,
                      metadata: Mapping[str, str] | None = None, progress: Progress | None = None) -> int:
    """Stream tensors into a safetensors file in the order given; returns the file size.

    `chunks(spec)` yields the raw little-endian bytes of one tensor, in pieces; only one
    piece is in memory at a time. Names must not be `__metadata__`.
    """
    ordered = list(specs)
    if any(s.name == "__metadata__" for s in ordered):
        raise UsageError("'__metadata__' is reserved in safetensors and cannot name a tensor")
    header = contract.header_bytes(ordered, metadata)
    written = 0
    with writing(path), open(path, "wb") as f:
        f.write(struct.pack("<Q", len(header)))
        f.write(header)
        for spec in ordered:
            got = 0
            for piece in chunks(spec):
                f.write(piece)
                n = memoryview(piece).nbytes
                got += n
                if progress:
                    progress(n)
            if got != spec.nbytes:
                raise DsparkError(f"{path}: tensor {spec.name!r} got {got:,} bytes, expected {spec.nbytes:,}")
            written += got
    return 8 + len(header) + written


def write_weights_like(base: str | os.PathLike[str], folder: str | os.PathLike[str],
                       replace: Mapping[str, BytesLike]) -> list[str]:
    """Write `base`'s weight files into `folder` with some tensors' bytes replaced; returns the files written.

    Every file keeps `base`'s exact header bytes (names, dtypes, shapes, offsets, `__metadata__`)
    and its sharding: the index and `config.json` are copied byte for byte. Each tensor not in
    `replace` is copied from `base` bit for bit; a replaced tensor's bytes must be exactly as
    long as the original's (the same dtype and shape). `base` is only read.

    Raises:
        UsageError: a replacement names no tensor of `base`, or has another byte length.
    """
    src, dst = Path(base), Path(folder)
    files = sorted(set(tensor_files(src).values()))
    headers = {file: read_header(file) for file in files}
    known = {name: info for header in headers.values() for name, info in header.tensors.items()}
    for name, data in replace.items():
        if name not in known:
            raise UsageError(f"{src}: holds no tensor {name!r} to write back")
        if memoryview(data).nbytes != known[name].nbytes:
            raise UsageError(f"{name}: {memoryview(data).nbytes:,} bytes, {src} stores {known[name].nbytes:,} "
                             f"({known[name].dtype} {list(known[name].shape)})")
    for file, header in headers.items():
        with writing(dst / file.name), open(dst / file.name, "wb") as out:
            for piece in iter_range(file, 0, header.data_start):
                out.write(piece)
            for name in header.tensors:          # data order (ascending offsets)
                if name in replace:
                    out.write(replace[name])
                else:
                    for piece in iter_range(file, *header.absolute_range(name)):
                        out.write(piece)
    for name in (contract.CONFIG_NAME, contract.INDEX_NAME):
        if (src / name).is_file():
            with writing(dst / name):
                shutil.copyfile(src / name, dst / name)
    return [file.name for file in files]
