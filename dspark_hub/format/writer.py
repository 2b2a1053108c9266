"""Writers: atomic outputs, a streaming safetensors writer, and `init` (a conforming checkpoint).

Every writer builds its output under a hidden temporary sibling and renames it into
place at the end, so an interrupted run leaves no partial output and never touches
its input. Existing outputs are replaced only with `force=True`.
"""

from __future__ import annotations

import os
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
from dspark_hub.format.tensorio import BytesLike
from dspark_hub.progress import Progress


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
    tmp = Path(tempfile.mkdtemp(prefix=f".{dst.name}.tmp-", dir=dst.parent))
    os.chmod(tmp, 0o777 & ~_umask())   # mkdtemp makes 0700; the result should look like any new folder
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
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
    fd, name = tempfile.mkstemp(prefix=f".{dst.name}.tmp-", dir=dst.parent)
    os.close(fd)
    mode = 0o666 & ~_umask()
    os.chmod(name, mode)
    try:
        yield Path(name)
        os.chmod(name, mode)
        os.replace(name, dst)
    except BaseException:
        Path(name).unlink(missing_ok=True)
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
    with open(path, "wb") as f:
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
    from dspark_hub.format.reader import read_header
    from dspark_hub.format.tensorio import iter_range, tensor_files

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
        with open(dst / file.name, "wb") as out:
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
            shutil.copyfile(src / name, dst / name)
    return [file.name for file in files]
