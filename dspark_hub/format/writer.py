"""Writers: atomic outputs, a streaming safetensors writer, and `init` (a conforming checkpoint).

Every writer builds its output under a hidden temporary sibling and renames it into
place at the end, so an interrupted run leaves no partial output and never touches
its input. Existing outputs are replaced only with `force=True`, and only what was checked:
`check_writable` records what is at the destination, and the final rename (`renames`) takes a
free name only while it is still free and replaces an existing entry only while it is the one
checked, so what another process put there meanwhile is kept. `refuse_own_inputs` refuses an
output that is, holds or sits inside one of the command's inputs.

The temporary sibling is named `.<name>.tmp-<pid>-<random>` (`.<name>.old-...` for an old output
being replaced without `renameat2`). A run killed outright (`kill -9`) cannot remove it; the next
writer of the same output removes every such sibling whose process is gone (`sweep_stale_temps`).
"""

from __future__ import annotations

import errno
import os
import re
import resource
import secrets
import shutil
import stat
import struct
import tempfile
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from dspark_hub.errors import ChangedMeanwhileError, DsparkError, RefusedOverwriteError, UsageError
from dspark_hub.format import contract, renames
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


def _entry(dst: Path) -> Path:
    """The directory entry a writer replaces: `dst` with its parent resolved, its own name kept (not followed)."""
    return dst.parent.resolve() / dst.name


def _identity(path: Path) -> tuple[int, int, int, int] | None:
    """What is at `path` (not followed): device, inode, type and change time; None when nothing is."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    return st.st_dev, st.st_ino, stat.S_IFMT(st.st_mode), st.st_ctime_ns


@dataclass(frozen=True)
class Checked:
    """What a writer found at its destination when it checked it (`check_writable`): nothing, or one entry.

    The final rename replaces only this: nothing (the name must still be free), or this same entry,
    unchanged since (same inode, same change time); anything else is kept and the write refused.
    """

    path: Path
    identity: tuple[int, int, int, int] | None

    @property
    def is_dir(self) -> bool:
        return self.identity is not None and self.identity[2] == stat.S_IFDIR


def check_writable(dst: str | os.PathLike[str], *, force: bool) -> Checked:
    """Raise `RefusedOverwriteError` when something is at `dst` (a dangling link too) and `force` is off.

    Returns what was found, for `atomic_dir` / `atomic_path` (`checked=`): the final rename replaces
    only that.
    """
    entry = _entry(Path(dst))
    identity = _identity(entry)
    if identity is not None and not force:
        raise RefusedOverwriteError(str(dst))
    return Checked(entry, identity)


#: What a command reads: (argument name, local path) pairs; None, or a path that does not exist, protects nothing.
Inputs = Iterable[tuple[str, "str | os.PathLike[str] | None"]]


def refuse_own_inputs(output: str | os.PathLike[str], inputs: Inputs, *, param: str, folder: bool,
                      keep: Collection[str] = ()) -> None:
    """Refuse an output that is one of the command's inputs, holds one, or would change one.

    `inputs`: what the command reads, as (argument name, path) pairs (the Python name; the CLI shows
    its flag). Whatever `force` says, the output is refused when it (or the file a link there points
    at) is an input, the same file as one (a hard link), holds one inside it, or lies inside an input
    folder: a `folder` output anywhere in it; a file output over a file the folder holds (what the
    command reads), except the names in `keep` directly in it (the card's own `README.md`).

    Raises:
        UsageError: naming the output, the input's argument and its path.
    """
    out = Path(output)
    places = {_entry(out), out.resolve()}          # the name written, and where a link there leads
    try:
        found: os.stat_result | None = os.stat(out)
    except OSError:
        found = None
    for name, given in inputs:
        if given is None or not os.path.lexists(given):
            continue
        how = _overlap(places, found, Path(given).resolve(), folder=folder, keep=keep)
        if how:
            raise UsageError(f"{output}: {how} the input `{name}` ({given}); a command never writes over what it "
                             "reads; choose another path", param=param)


def _overlap(places: set[Path], found: os.stat_result | None, path: Path, *, folder: bool,
             keep: Collection[str]) -> str | None:
    """How an output (its `places`, and what is there) meets the input `path` (resolved), if it does."""
    if path in places or (found is not None and _same_inode(found, path)):
        return "is"
    if any(path.is_relative_to(place) for place in places):
        return "contains"
    if not path.is_dir():
        return None
    for place in places:
        if place.is_relative_to(path) and (folder or (os.path.lexists(place) and not (
                place.parent == path and place.name in keep))):
            return "is inside"
    if found is not None and found.st_nlink > 1 and stat.S_ISREG(found.st_mode) and any(
            _same_inode(found, Path(top) / file) for top, _, files in os.walk(path) for file in files):
        return "is a hard link of a file of"
    return None


def _same_inode(found: os.stat_result, path: Path) -> bool:
    try:
        st = os.stat(path)
    except OSError:
        return False
    return (st.st_dev, st.st_ino) == (found.st_dev, found.st_ino)


def _refuse_enclosing(dst: Path) -> Path:
    """`dst` with its parent resolved; refuse `.`, a name ending in `..`, the current folder and its parents.

    Replacing the folder a shell is in (or one above it) would pull the working directory out
    from under the user, and a trailing `..` names a folder other than the one the name shows.
    """
    cwd = Path.cwd().resolve()
    if dst.name in ("", "..") or dst.resolve() == cwd or dst.resolve() in cwd.parents:
        raise UsageError(f"{dst}: is the current folder or a parent of it; writing there would replace the "
                         "folder you are in; pass a new folder name (e.g. out/draft)")
    return _entry(dst)


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
    pattern = re.compile(rf"\.{re.escape(dst.name)}\.(?:tmp|old)-(\d+)-[A-Za-z0-9_]{{8}}")
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


def _checked(dst: Path, force: bool, checked: Checked | None) -> Checked:
    """The caller's earlier check of `dst`, or one made now."""
    if checked is None:
        return check_writable(dst, force=force)
    if checked.path != _entry(dst):
        raise ValueError(f"checked {checked.path}, writing {dst}")
    if checked.identity is not None and not force:
        raise RefusedOverwriteError(str(dst))
    return checked


@contextmanager
def atomic_dir(dst: str | os.PathLike[str], *, force: bool = False, checked: Checked | None = None) -> Iterator[Path]:
    """Yield an empty temporary folder that becomes `dst` only if the block completes.

    `checked`: what `check_writable(dst, force=force)` found when the command started (default: check
    now). The final rename replaces only that (see `Checked`).

    Raises:
        UsageError: `dst` is (or ends in) `.` or `..`, the current folder or one of its parents.
        RefusedOverwriteError: `dst` exists and `force` is False, checked first and again at the
            final rename (what appeared meanwhile is kept).
        ChangedMeanwhileError: with `force`, what is at `dst` at the final rename is not what was checked.
    """
    dst = _refuse_enclosing(Path(dst))
    found = _checked(dst, force, checked)
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
    _install(tmp, found)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def _install(tmp: Path, checked: Checked) -> None:
    """Rename `tmp` to the checked destination, replacing only what was checked; on failure remove `tmp`.

    Nothing was there: the name is taken only while it is still free (`rename_noreplace`). Something
    was (`force`): it must still be there, unchanged; the two are swapped in one step and what was
    swapped out is checked again before it is removed (else swapped back).
    """
    dst = checked.path
    try:
        if checked.identity is None:
            try:
                renames.rename_noreplace(tmp, dst)
            except FileExistsError:
                raise RefusedOverwriteError(str(dst), "appeared while this output was being written (another "
                                            "process made it); it was kept") from None
            return
        _replace_checked(tmp, checked)
    except BaseException:
        _remove(tmp)
        raise


def _changed(dst: Path) -> ChangedMeanwhileError:
    return ChangedMeanwhileError(f"{dst}: changed since it was checked (another process wrote, replaced or removed "
                              "it while this ran); it was kept and this output not written; run again")


def _replace_checked(tmp: Path, checked: Checked) -> None:
    dst = checked.path
    if _identity(dst) != checked.identity:
        raise _changed(dst)
    try:
        swapped = renames.exchange(tmp, dst)
    except FileNotFoundError:
        raise _changed(dst) from None
    if swapped:                                  # tmp now holds what was at dst
        if _same_entry(tmp, checked):
            _remove(tmp)
            return
        renames.exchange(tmp, dst)
        raise _changed(dst)
    trash = dst.with_name(f".{dst.name}.old-{os.getpid()}-{secrets.token_hex(4)}")
    os.rename(dst, trash)
    if not _same_entry(trash, checked):
        _put_back(trash, dst)
        raise _changed(dst)
    try:
        renames.rename_noreplace(tmp, dst)
    except BaseException:
        _put_back(trash, dst)
        raise
    _remove(trash)


def _same_entry(path: Path, checked: Checked) -> bool:
    """`path` is the entry that was checked (device, inode, type; a rename changes its change time)."""
    now = _identity(path)
    return now is not None and checked.identity is not None and now[:3] == checked.identity[:3]


def _put_back(trash: Path, dst: Path) -> None:
    try:
        renames.rename_noreplace(trash, dst)
    except OSError as e:
        raise DsparkError(f"{dst}: could not put the previous output back ({e.strerror}); it is at {trash}, "
                          "move it back by hand") from e


@contextmanager
def atomic_path(dst: str | os.PathLike[str], *, force: bool = False, checked: Checked | None = None) -> Iterator[Path]:
    """Yield a temporary sibling path of `dst`; it replaces `dst` only if the block completes.

    The result gets the permissions of any new file (0666 minus the umask), also when the block
    replaced the temporary file itself (safetensors `save_file` writes 0600). `checked`: as in
    `atomic_dir`; a folder at `dst` is never replaced by a file.
    """
    dst = Path(dst)
    found = _checked(dst, force, checked)
    if found.is_dir:
        raise UsageError(f"{dst}: is a folder; a file does not replace one; pass a file path")
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
    except BaseException as e:
        Path(name).unlink(missing_ok=True)
        if isinstance(e, OSError) and e.filename == name:
            raise OSError(e.errno, e.strerror, str(dst)) from None     # the output, not its temporary name
        raise
    _install(Path(name), found)


@contextmanager
def atomic_file(dst: str | os.PathLike[str], *, force: bool = False, mode: str = "wb",
                checked: Checked | None = None) -> Iterator[IO[Any]]:
    """Open a temporary sibling of `dst` for writing; rename it over `dst` on success (see `atomic_path`)."""
    with atomic_path(dst, force=force, checked=checked) as tmp, open(tmp, mode) as f:
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
