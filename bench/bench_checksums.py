"""Time `compute_manifest` (SHA-256 + git/LFS ids, parallel) against hashlib alone and `sha256sum`.

Usage: python bench/bench_checksums.py [FOLDER]   (default: a 512 MiB random file under bench/out/)
Same run, warm page cache (each candidate runs once to warm, then is timed). Prints the ratios.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from dspark_hub.format.digests import checkpoint_files, compute_manifest


def make_folder() -> Path:
    folder = Path(__file__).parent / "out" / "checksums-bench"
    target = folder / "model.safetensors"
    if not target.exists() or target.stat().st_size != 512 << 20:
        folder.mkdir(parents=True, exist_ok=True)
        with open(target, "wb") as f:
            for _ in range(64):
                f.write(os.urandom(8 << 20))
        (folder / "config.json").write_text("{}\n")
    return folder


def hashlib_alone(folder: Path) -> None:
    for rel in checkpoint_files(folder):
        h = hashlib.sha256()
        with open(folder / rel, "rb") as f:
            while chunk := f.read(8 << 20):
                h.update(chunk)


def sha256sum(folder: Path) -> None:
    subprocess.run(["sha256sum", *checkpoint_files(folder)], cwd=folder, check=True, capture_output=True)


def timed(fn, folder: Path) -> float:
    fn(folder)  # warm
    start = time.perf_counter()
    fn(folder)
    return time.perf_counter() - start


def main() -> None:
    folder = Path(sys.argv[1]) if len(sys.argv) > 1 else make_folder()
    size = sum((folder / p).stat().st_size for p in checkpoint_files(folder))
    ours = timed(compute_manifest, folder)
    alone = timed(hashlib_alone, folder)
    coreutils = timed(sha256sum, folder)
    gib = size / (1 << 30)
    print(f"{size:,} bytes in {len(checkpoint_files(folder))} files")
    print(f"compute_manifest  {ours:7.3f} s  {gib / ours:6.2f} GiB/s")
    print(f"hashlib alone     {alone:7.3f} s  {gib / alone:6.2f} GiB/s")
    print(f"sha256sum         {coreutils:7.3f} s  {gib / coreutils:6.2f} GiB/s")
    print(f"ratio ours/hashlib = {ours / alone:.2f}x, ours/sha256sum = {ours / coreutils:.2f}x")


if __name__ == "__main__":
    main()
