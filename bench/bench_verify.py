"""Header-level `dspark-hub verify` on the full-size reference vs reading the same header with safe_open.

Usage: python bench/bench_verify.py [CHECKPOINT_DIR]

Both are whole processes, as a user runs them: ours imports no torch; the peer
(`safetensors.safe_open(..., framework="pt")`) pays for importing torch.
Target: ours under 0.5 s, far below the peer.
"""

from __future__ import annotations

import sys
from pathlib import Path

from _reference import reference_checkpoint, time_process

PEER = ("import sys\nfrom safetensors import safe_open\n"
        "with safe_open(sys.argv[1], framework='pt') as f:\n"
        "    names = list(f.keys()); meta = f.metadata()\n"
        "    shapes = [f.get_slice(n).get_shape() for n in names]\n"
        "print(len(names))\n")


def main() -> None:
    folder = reference_checkpoint(Path(sys.argv[1]) if len(sys.argv) > 1 else Path("/work/bench-data/kimi-k3"))
    weights = folder / "model.safetensors"
    ours, _ = time_process([sys.executable, "-m", "dspark_hub", "verify", str(folder)])
    drop_in, _ = time_process([sys.executable, "-m", "dspark_hub", "verify", str(folder), "--drop-in", "kimi-k3"])
    peer, _ = time_process([sys.executable, "-c", PEER, str(weights)])
    print(f"checkpoint: {weights} ({weights.stat().st_size:,} bytes)")
    print(f"dspark-hub verify                     {ours:7.3f} s  (target < 0.5 s)")
    print(f"dspark-hub verify --drop-in kimi-k3   {drop_in:7.3f} s")
    print(f"safetensors.safe_open header (peer)   {peer:7.3f} s")
    print(f"ratio ours/peer: {ours / peer:.2f}  (peer is {peer / ours:.1f}x slower)")


if __name__ == "__main__":
    main()
