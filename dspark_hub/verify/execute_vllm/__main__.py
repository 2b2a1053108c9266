"""`python -m dspark_hub.verify.execute_vllm`: the child process of `run_isolated` (`vllm.child.serve`)."""

from __future__ import annotations

import os
import sys

from dspark_hub.verify.execute_vllm.runner import handle
from dspark_hub.vllm.child import serve


def main() -> None:
    serve(handle)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)   # skip vLLM's and gloo's slow teardown


if __name__ == "__main__":
    main()
