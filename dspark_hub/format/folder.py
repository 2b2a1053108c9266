"""Which files a checkpoint folder holds, and how a file is opened by name: the one decision of each.

`list_folder` is the only walker of a checkpoint folder. `verify` (through `LocalSource`),
`checksums`, `package`, `publish`, `card` and `diff` all see the files it lists, so the gate
judges exactly the bytes that get hashed and uploaded. The rules (docs/security.md, "Files,
links and special files"):

- The walk keeps its own stack (no recursion): any nesting the operating system can name is
  listed. A directory met twice (a bind mount of a parent) is reported, not walked again.
- Tool folders (`SKIP_DIRS`: `.git`, `.cache`, ...) are not part of a checkpoint and are skipped.
- A directory symlink is never followed. It is reported: `LINK_CYCLE` when it points at a folder
  that contains it (`ln -s . loop`, `ln -s .. up`), `LINK_OUTSIDE` when it leads out of the
  folder, `DIR_LINK` when it points at another folder inside (its files are listed once, there).
- A file symlink is listed under its own name when its target resolves inside the folder, or
  inside the `blobs/` of the Hugging Face cache repository whose `snapshots/<revision>/` holds
  the folder (how `hf download` stores models). Any other target is `LINK_OUTSIDE`; links that
  point at each other are `LINK_CYCLE`; a dangling link is `FILE_UNREADABLE`.
- FIFOs, sockets and devices are `SPECIAL_FILE` and never opened (a FIFO blocks its reader).
- A name that is not UTF-8 is `BAD_FILE_NAME` (no manifest, card or Hub path can carry it).

Every problem leaves the file out of `FolderListing.files` and is named in `problems`: `verify`
reports each as an error finding; the commands that hash (`checksums`, `package`, `publish`)
refuse the folder (`folder_files`).

`open_regular` opens a file for reading only when it is a regular file, without blocking on a
FIFO; every reader of a named file goes through it. `stamp_files` / `changed_files` say whether a
file changed between two moments without reading it (the publish gate's judgment and the upload).
"""

from __future__ import annotations

import errno
import io
import os
import stat
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from dspark_hub.errors import CheckpointFormatError, CheckpointNotFoundError

#: Tool folders, never part of a checkpoint (git, caches); skipped by the walk, whatever their kind.
SKIP_DIRS = frozenset({".git", ".cache", ".huggingface", "__pycache__"})

#: Problems `list_folder` names (codes of `FolderProblem` and of the error `folder_files` raises).
#: Append-only: tools match on them. (`FILE_UNREADABLE` is `checkpoint.FOLDER_CODES`'.)
LISTING_CODES: dict[str, str] = {
    "SPECIAL_FILE": "a FIFO, socket or device where a file belongs (never opened: a FIFO blocks its reader)",
    "LINK_OUTSIDE": "a symlink that leads out of the checkpoint folder (never followed)",
    "LINK_CYCLE": "a symlink cycle: a directory link to a folder that contains it, or links that point at "
                  "each other (never followed)",
    "DIR_LINK": "a directory symlink inside the folder (never followed; its target's files are listed there)",
    "BAD_FILE_NAME": "a file name that is not UTF-8 text",
    "DATA_PATH_OUTSIDE": "a data folder's manifest names a file by an absolute path or through `..` (never read)",
    "DATA_FILE_MISSING": "a data folder's manifest names a file the folder does not hold as a regular file",
}
_UNREADABLE = "FILE_UNREADABLE"
_FIX = {
    "SPECIAL_FILE": "remove it, or replace it with the regular file it stands for",
    "LINK_OUTSIDE": "copy the file(s) into the folder instead of linking to them",
    "LINK_CYCLE": "remove the link",
    "DIR_LINK": "remove the link, or replace it with a copy of the folder",
    "BAD_FILE_NAME": "rename it with a UTF-8 name",
    "DATA_PATH_OUTSIDE": "name files inside the folder, relative to it",
    "DATA_FILE_MISSING": "write the folder again",
    _UNREADABLE: "fix or remove it (a dangling symlink, or a file without read permission)",
}


@dataclass(frozen=True)
class FolderProblem:
    """A folder entry that is not a readable file of the checkpoint: `path` (relative, POSIX), a code
    of `LISTING_CODES` (or `FILE_UNREADABLE`) and what was found."""

    path: str
    code: str
    detail: str

    @property
    def hint(self) -> str:
        return _FIX[self.code]


@dataclass(frozen=True)
class FolderListing:
    """The files of a checkpoint folder (relative POSIX path -> size, sorted) and the entries left out."""

    root: Path
    files: dict[str, int]
    problems: tuple[FolderProblem, ...]

    def refuse_problems(self) -> None:
        """Raise when any entry was left out: a command that hashes or uploads the folder must not skip one.

        Raises:
            CheckpointFormatError: the first problem's code, naming it and how many more there are.
        """
        if not self.problems:
            return
        first, more = self.problems[0], len(self.problems) - 1
        also = f" (and {more} more entr{'y' if more == 1 else 'ies'} like it)" if more else ""
        raise CheckpointFormatError(first.code, f"{first.detail}{also}; the folder is not read while it holds "
                                    f"such entries", path=str(self.root / first.path), hint=first.hint)


def _kind(mode: int) -> str:
    """How a non-regular file is named in messages."""
    if stat.S_ISFIFO(mode):
        return "a named pipe (FIFO)"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode):
        return "a character device"
    if stat.S_ISBLK(mode):
        return "a block device"
    if stat.S_ISDIR(mode):
        return "a directory"
    return "not a regular file"


def _within(path: str, folder: str) -> bool:
    """Whether the resolved `path` is `folder` or inside it (both resolved)."""
    return path == folder or path.startswith(folder.rstrip(os.sep) + os.sep)


#: How the Hugging Face cache names a repository's folder (`models--ORG--NAME`).
HF_CACHE_REPO_PREFIXES = ("models--", "datasets--", "spaces--")


def hf_cache_blobs(real_root: str) -> str | None:
    """The `blobs/` folder of the Hugging Face cache repository whose `snapshots/<revision>/` holds
    `real_root` (resolved), or None when the folder is not in a cache snapshot."""
    path = Path(real_root)
    for candidate in (path, *path.parents):
        if candidate.parent.name == "snapshots" and candidate.parent.parent.name.startswith(HF_CACHE_REPO_PREFIXES):
            blobs = candidate.parent.parent / "blobs"
            return str(blobs) if blobs.is_dir() else None
    return None


class _Walk:
    """One walk of a folder: the files found and the problems met."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.real_root = os.path.realpath(root)
        self.blobs = hf_cache_blobs(self.real_root)
        self.files: dict[str, int] = {}
        self.problems: list[FolderProblem] = []
        self.seen_dirs: set[tuple[int, int]] = set()

    def problem(self, rel: str, code: str, detail: str) -> None:
        self.problems.append(FolderProblem(rel, code, detail))

    def run(self) -> None:
        stack = [""]
        while stack:
            rel_dir = stack.pop()
            for entry in self._entries(rel_dir):
                rel = f"{rel_dir}/{entry.name}" if rel_dir else entry.name
                if entry.name in SKIP_DIRS:
                    continue
                if not _is_utf8(rel):
                    self.problem(rel.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace"),
                                 "BAD_FILE_NAME", "the name is not UTF-8 text")
                    continue
                try:
                    if entry.is_symlink():
                        self._link(rel)
                        continue
                    st = entry.stat(follow_symlinks=False)
                except OSError as e:
                    self.problem(rel, _UNREADABLE, f"cannot be read ({e.strerror or e})")
                    continue
                if stat.S_ISDIR(st.st_mode):
                    if self._first_visit(rel, st):
                        stack.append(rel)
                elif stat.S_ISREG(st.st_mode):
                    self.files[rel] = st.st_size
                else:
                    self.problem(rel, "SPECIAL_FILE", f"is {_kind(st.st_mode)}, not a regular file")

    def _entries(self, rel_dir: str) -> list[os.DirEntry[str]]:
        where = self.root / rel_dir if rel_dir else self.root
        try:
            with os.scandir(where) as it:
                return sorted(it, key=lambda e: e.name)
        except OSError as e:
            if not rel_dir:
                raise CheckpointNotFoundError(f"{self.root}: cannot list the folder ({e.strerror or e})") from None
            self.problem(rel_dir, _UNREADABLE, f"the folder cannot be listed ({e.strerror or e})")
            return []

    def _first_visit(self, rel: str, st: os.stat_result) -> bool:
        key = (st.st_dev, st.st_ino)
        if key in self.seen_dirs:
            self.problem(rel, "LINK_CYCLE", "is a folder already walked (a bind mount of a folder that contains "
                         "it?); not walked again")
            return False
        self.seen_dirs.add(key)
        return True

    def _link(self, rel: str) -> None:
        full = os.path.join(self.root, rel)
        shown = os.readlink(full)
        try:
            st = os.stat(full)
        except OSError as e:
            if e.errno == errno.ELOOP:
                self.problem(rel, "LINK_CYCLE", f"is a symlink to {shown!r} that leads back to itself")
            else:
                self.problem(rel, _UNREADABLE, f"is a symlink to {shown!r}, which cannot be read "
                             f"({e.strerror or e})")
            return
        target = os.path.realpath(full)
        inside = _within(target, self.real_root)
        if stat.S_ISDIR(st.st_mode):
            if _within(os.path.realpath(os.path.dirname(full)), target):
                self.problem(rel, "LINK_CYCLE", f"is a symlink to {shown!r}, a folder that contains it: walking "
                             "it would never end; not followed")
            elif not inside:
                self.problem(rel, "LINK_OUTSIDE", f"is a symlink to the folder {shown!r}, outside the checkpoint; "
                             "not followed")
            else:
                self.problem(rel, "DIR_LINK", f"is a symlink to the folder {shown!r} inside the checkpoint; "
                             "directory links are not followed")
        elif not stat.S_ISREG(st.st_mode):
            self.problem(rel, "SPECIAL_FILE", f"is a symlink to {shown!r}, {_kind(st.st_mode)}, not a regular file")
        elif inside or (self.blobs is not None and _within(target, self.blobs)):
            self.files[rel] = st.st_size
        else:
            self.problem(rel, "LINK_OUTSIDE", f"is a symlink to {shown!r}, a file outside the checkpoint (and "
                         "outside a Hugging Face cache snapshot's blobs); not followed")


def _is_utf8(name: str) -> bool:
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def list_folder(root: str | os.PathLike[str]) -> FolderListing:
    """Every file of a checkpoint folder and every entry left out (see the module doc for the rules).

    Raises:
        CheckpointNotFoundError: `root` does not exist, is not a directory, or cannot be listed.
    """
    path = Path(root)
    if not path.exists():
        raise CheckpointNotFoundError(f"{root}: no such file or directory", hint="pass a checkpoint folder")
    if not path.is_dir():
        raise CheckpointNotFoundError(f"{root}: not a directory", hint="pass a checkpoint folder")
    walk = _Walk(path)
    walk.run()
    problems = tuple(sorted(walk.problems, key=lambda p: p.path))
    return FolderListing(root=path, files=dict(sorted(walk.files.items())), problems=problems)


def folder_files(root: str | os.PathLike[str]) -> list[str]:
    """The relative POSIX paths of every file of a checkpoint folder, sorted; refuses a folder that holds
    anything `list_folder` leaves out (a command that hashes or uploads must not skip an entry silently).

    Raises:
        CheckpointNotFoundError: `root` is not a directory.
        CheckpointFormatError: a `LISTING_CODES` code (or `FILE_UNREADABLE`) for the first entry left out.
    """
    listing = list_folder(root)
    listing.refuse_problems()
    return list(listing.files)


def data_folder(root: str | os.PathLike[str]) -> FolderListing:
    """The listing of a data folder (rollouts, hidden-state files), refused when it holds any entry a model folder
    may not: a data folder is read under the same rules (no link out, no FIFO, socket or device, UTF-8 names).

    Raises:
        CheckpointNotFoundError: `root` is not a directory.
        CheckpointFormatError: a `LISTING_CODES` code (or `FILE_UNREADABLE`) for the first entry left out.
    """
    listing = list_folder(root)
    listing.refuse_problems()
    return listing


def _leaves_folder(name: str) -> bool:
    return name.startswith(("/", "\\")) or "\\" in name or ".." in name.split("/") or (len(name) > 1 and name[1] == ":")


def listed_file(listing: FolderListing, name: object, *, named_in: str, key: str) -> Path:
    """The path of the file `name` that a data folder's manifest (`named_in`, at `key`) names, only when it is
    exactly a relative path of a regular file the listing holds: never absolute, never `..`, never through a
    link out of the folder.

    Raises:
        CheckpointFormatError: `DATA_PATH_OUTSIDE` (absolute, or through `..`), `DATA_FILE_MISSING` (no such
            regular file in the folder, or not a plain relative name).
    """
    if not isinstance(name, str) or not name:
        raise CheckpointFormatError("DATA_FILE_MISSING", f"{key} is {name!r}, not a file name", path=named_in,
                                    hint=_FIX["DATA_FILE_MISSING"])
    if _leaves_folder(name):
        raise CheckpointFormatError("DATA_PATH_OUTSIDE", f"{key} names {name!r}, a path outside {listing.root}; "
                                    "it is not read", path=named_in, hint=_FIX["DATA_PATH_OUTSIDE"])
    if name not in listing.files:
        raise CheckpointFormatError("DATA_FILE_MISSING", f"{key} names {name!r}, which is not a regular file of "
                                    f"{listing.root}", path=named_in, hint=_FIX["DATA_FILE_MISSING"])
    return listing.root / name


# ---------------------------------------------------------------- has a file changed since?

#: What changes with a file's content, read without reading it: device, inode, size, and the modification
#: and change times in ns (a write, truncate or rename over it changes one; `ctime` cannot be set back).
FileStamp = tuple[int, int, int, int, int]


def stamp_files(paths: Iterable[Path]) -> dict[Path, FileStamp | None]:
    """Each file's `FileStamp` (following links, as its readers do); None for one that cannot be stat'ed."""
    stamps: dict[Path, FileStamp | None] = {}
    for path in paths:
        try:
            st = os.stat(path)
        except OSError:
            stamps[path] = None
            continue
        stamps[path] = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    return stamps


def changed_files(stamps: Mapping[Path, FileStamp | None]) -> list[Path]:
    """The files whose stamp is not the one in `stamps` now (written, replaced, removed or unreadable)."""
    now = stamp_files(stamps)
    return [path for path, stamp in stamps.items() if stamp is None or now[path] != stamp]


# ---------------------------------------------------------------- opening a file by name

def _not_regular(path: str | os.PathLike[str], mode: int, display: str | None) -> Exception:
    where = display or os.fspath(path)
    if stat.S_ISDIR(mode):
        return CheckpointNotFoundError(f"{where}: is a directory, not a file")
    return CheckpointFormatError("SPECIAL_FILE", f"is {_kind(mode)}, not a regular file; it is not read",
                                 path=where, hint=_FIX["SPECIAL_FILE"])


def check_regular(path: str | os.PathLike[str], *, display: str | None = None) -> None:
    """Refuse a path that is not a regular file (symlinks to one are fine), without opening it.

    Raises:
        FileNotFoundError, PermissionError (OSError): it cannot be looked at.
        CheckpointFormatError: `SPECIAL_FILE`, a FIFO, socket or device.
        CheckpointNotFoundError: it is a directory.
    """
    mode = os.stat(path).st_mode
    if not stat.S_ISREG(mode):
        raise _not_regular(path, mode, display)


def open_regular(path: str | os.PathLike[str], *, display: str | None = None) -> io.FileIO:
    """Open a file for binary reading, only if it is a regular file (symlinks to one are fine).

    A FIFO, socket or device is refused before it is opened, and the file is opened non-blocking
    and checked again (so one swapped in meanwhile cannot block either).

    Raises:
        FileNotFoundError, PermissionError (OSError): the file cannot be opened.
        CheckpointFormatError: `SPECIAL_FILE`, it is not a regular file.
        CheckpointNotFoundError: it is a directory.
    """
    check_regular(path, display=display)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as e:
        if e.errno == errno.ENXIO:   # a socket swapped in
            raise _not_regular(path, stat.S_IFSOCK, display) from None
        raise
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise _not_regular(path, mode, display)
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb", buffering=0)
    except BaseException:
        os.close(fd)
        raise


def read_regular(path: str | os.PathLike[str], *, display: str | None = None) -> bytes:
    """The whole content of a regular file (see `open_regular`)."""
    with open_regular(path, display=display) as f:
        return f.read()
