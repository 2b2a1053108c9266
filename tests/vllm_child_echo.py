"""A child process for `tests/test_vllm_home.py`: `vllm.child.serve` over requests that exercise the protocol."""

from __future__ import annotations

import os
import sys
import time
from typing import Any

from dspark_hub.errors import MissingDependencyError, UsageError, VllmInternalsMoved
from dspark_hub.vllm.child import serve


def handle(request: dict[str, Any]) -> dict[str, Any]:
    op = request.get("op")
    if op == "echo":
        return {"echo": request.get("value")}
    if op == "noisy":       # what vLLM does: print to stdout and stderr; neither may reach the reply stream
        print("vLLM says hello on stdout", flush=True)
        print("vLLM says hello on stderr", file=sys.stderr, flush=True)
        os.write(1, b"raw bytes on fd 1\n")
        return {"quiet": True}
    if op == "usage":
        raise UsageError("teacher/config.json: head_dim is 16", param="teacher")
    if op == "missing":
        raise MissingDependencyError("cannot import vllm")
    if op == "moved":
        raise VllmInternalsMoved("DefaultModelLoader.load_weights is gone")
    if op == "bug":
        raise KeyError("no such tensor")
    if op == "die":
        print("dying now", file=sys.stderr, flush=True)
        os._exit(3)
    if op == "hang":
        time.sleep(3600)
    return {}


if __name__ == "__main__":
    serve(handle)
