"""One overlapped pass over a weight file: its SHA-256 and the statistics of every tensor in it.

The file is read in windows into a ring of reused buffers. A hash thread feeds each window to
`hashlib` (which releases the GIL) and hands it to a stats thread, which scans it with numpy
(`verify.tensor_stats`) while the next window is read and hashed, reading bytes the hash has just
pulled into the shared cache. The windows are read, not mapped: a mapped file that shrinks under the
scan kills the process with SIGBUS, while a short read is a `FILE_CHANGED` error naming the file.
Several files run in parallel. Memory is bounded by `RING_DEPTH x WINDOW_BYTES` of buffers per file
plus small scratch arrays.
"""

from __future__ import annotations

import hashlib
import io
import os
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from dspark_hub.documents import Document
from dspark_hub.errors import CheckpointFormatError
from dspark_hub.format.folder import open_regular
from dspark_hub.format.reader import SafetensorsHeader
from dspark_hub.progress import Progress
from dspark_hub.verify.tensor_stats import FileScanner, TensorStats

RING_DEPTH = 4
#: Bytes read at a time: the window the hash has just read is still in the shared cache when the
#: stats thread scans it (two windows fit in L3 with room to spare).
WINDOW_BYTES = 8 << 20


@dataclass
class FileScan(Document):
    """One scanned weight file: its digest and the statistics of its tensors."""

    KEYS = ("name", "size", "sha256", "seconds=rounded_seconds")

    name: str
    size: int
    sha256: str
    seconds: float
    tensors: list[TensorStats] = field(default_factory=list)

    @property
    def rounded_seconds(self) -> float:
        """The hashing time, to the millisecond."""
        return round(self.seconds, 3)


class _Job:
    __slots__ = ("buffer", "length", "offset")

    def __init__(self, buffer: bytearray, offset: int, length: int) -> None:
        self.buffer, self.offset, self.length = buffer, offset, length


def _consume(jobs: queue.Queue[_Job | None], work: Callable[[_Job], None], done: Callable[[_Job | None], None],
             failures: list[BaseException]) -> None:
    """Run `work` on each job until the `None` sentinel; `done` gets every job, then the sentinel."""
    while (job := jobs.get()) is not None:
        try:
            if not failures:
                work(job)
        except BaseException as e:   # re-raised by the reader thread
            failures.append(e)
        finally:
            done(job)
    done(None)


def _hash_window(hasher: hashlib._Hash, job: _Job) -> None:
    with memoryview(job.buffer) as view:
        hasher.update(view[:job.length])


def _scan_window(scanner: FileScanner, job: _Job) -> None:
    with memoryview(job.buffer) as view:
        scanner.feed(job.offset, view[:job.length])


def _changed(shown: str, size: int, now: int) -> CheckpointFormatError:
    return CheckpointFormatError("FILE_CHANGED", f"size changed while it was scanned ({size:,} -> {now:,} bytes); "
                                 "verify again once writers are done", path=shown)


def _read_window(f: io.FileIO, view: memoryview) -> int:
    """Fill `view` from the file's current position; fewer bytes only at end of file."""
    got = 0
    while got < len(view):
        n = f.readinto(view[got:])
        if not n:
            break
        got += n
    return got


def scan_file(path: str | os.PathLike[str], header: SafetensorsHeader, *, name: str | None = None,
              progress: Progress | None = None, chunk_bytes: int = WINDOW_BYTES,
              depth: int = RING_DEPTH) -> FileScan:
    """SHA-256 of a whole file and statistics of every tensor in it, in one overlapped pass.

    The file is read in windows of `chunk_bytes` into `depth` reused buffers (which bounds
    memory). The hash thread hashes each window and hands it to the stats thread, which scans
    it while the next one is read and hashed: the scan reads bytes the hash has just pulled into
    the shared cache, and both run GIL-free most of the time (hashlib and numpy release it).

    Args:
        path: the safetensors file.
        header: its validated header (`reader.read_header`).
        name: how to name the file in the result and in errors (default: the path).
        progress: called with the number of bytes read.
        chunk_bytes: window size.
        depth: windows in flight.

    Raises:
        CheckpointFormatError: `FILE_CHANGED`, the file is not the size its header was read at (it shrank
            or grew since, or while it was scanned); `SPECIAL_FILE`, it is not a regular file.
    """
    shown = name or str(path)
    scanner = FileScanner(header, shown)
    hasher = hashlib.sha256()
    free: queue.Queue[bytearray] = queue.Queue()
    failures: list[BaseException] = []
    to_hash: queue.Queue[_Job | None] = queue.Queue()
    to_scan: queue.Queue[_Job | None] = queue.Queue()
    size = header.file_size

    def scanned(job: _Job | None) -> None:
        if job is not None:
            free.put(job.buffer)

    workers = [
        threading.Thread(target=_consume, daemon=True, name="deep-hash",
                         args=(to_hash, lambda job: _hash_window(hasher, job), to_scan.put, failures)),
        threading.Thread(target=_consume, daemon=True, name="deep-stats",
                         args=(to_scan, lambda job: _scan_window(scanner, job), scanned, failures)),
    ]
    for w in workers:
        w.start()
    began = time.perf_counter()
    try:
        with open_regular(path, display=shown) as f:
            if (now := os.fstat(f.fileno()).st_size) != size:
                raise _changed(shown, size, now)
            window = max(1, min(chunk_bytes, size))
            for _ in range(max(1, depth)):
                free.put(bytearray(window))
            for offset in range(0, size, window):
                buffer = free.get()
                if failures:
                    break
                length = min(window, size - offset)
                got = _read_window(f, memoryview(buffer)[:length])
                if got < length:
                    raise _changed(shown, size, offset + got)
                to_hash.put(_Job(buffer, offset, length))
                if progress:
                    progress(length)
            if not failures and ((now := os.fstat(f.fileno()).st_size) != size or f.read(1)):
                raise _changed(shown, size, max(now, size + 1))
    finally:
        to_hash.put(None)    # the hash thread passes it on to the stats thread
        for w in workers:
            w.join()
    if failures:
        raise failures[0]
    return FileScan(name=shown, size=size, sha256=hasher.hexdigest(), seconds=time.perf_counter() - began,
                    tensors=scanner.stats)


def scan_files(files: list[tuple[str, Path, SafetensorsHeader]], *, progress: Progress | None = None,
               workers: int | None = None) -> list[FileScan]:
    """`scan_file` over (name, path, header) triples, several files in parallel; results in input order."""
    if len(files) <= 1:
        return [scan_file(path, header, name=name, progress=progress) for name, path, header in files]
    n = workers or min(len(files), max(2, (os.cpu_count() or 2) // 2))
    with ThreadPoolExecutor(max_workers=n, thread_name_prefix="deep-file") as pool:
        futures = [pool.submit(scan_file, path, header, name=name, progress=progress)
                   for name, path, header in files]
        return [f.result() for f in futures]
