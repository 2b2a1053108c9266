"""Wall time of the vLLM conformance matrix (tests/vllm_matrix.py) built and loaded in ONE process.

Usage: $(.ci/venv-vllm.sh) bench/bench_vllm_matrix.py

Every case is built in a temporary folder and loaded through vLLM's real loader by
`verify.execute_vllm.execute`, as tests/test_vllm_conformance.py does (the research ran one process
per case; one process imports vLLM once). Reported: drafts, total seconds, seconds per draft and the
load average; tests/test_vllm_conformance.py checks the rows, never the time.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from dspark_hub.verify.execute_vllm import execute  # noqa: E402 (after the repository joins the path)
from tests.vllm_matrix import CASES, build  # noqa: E402


def main() -> None:
    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as folder:
        started = time.perf_counter()
        for case in CASES:
            execute(build(case, Path(folder) / case))
        seconds = time.perf_counter() - started
    print(f"vLLM conformance matrix: {len(CASES)} drafts in {seconds:.1f} s in one process "
          f"({seconds / len(CASES):.2f} s a draft; load before: {load:.1f})")


if __name__ == "__main__":
    main()
