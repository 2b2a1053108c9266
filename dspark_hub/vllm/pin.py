"""The vLLM release dspark-hub is built against, and the one version policy (standard library only).

The policy, applied by every user of vLLM (the loader execution, the teacher engine, the measured eval)
in the process that imports vLLM, before any work:

- exactly `PINNED_VERSION`: accepted, nothing said (every vLLM-marked test runs on it);
- another release of the same series (`0.32.x`): accepted with a warning, since the internals the
  engines hook rarely move within a series and every hook is checked before use;
- any other release: refused, unless the environment sets `DSPARK_ALLOW_UNTESTED_VLLM=1`, which turns
  the refusal into a warning (the run then says that it ran an untested vLLM).

`.ci/venv-vllm.sh` builds the virtualenv of `PINNED_VERSION` (a test keeps its `VLLM_VERSION` equal).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

#: The vLLM release the engines and the rules were built and tested against.
PINNED_VERSION = "0.32.0"
#: Set to 1 to run a vLLM outside the pinned series anyway (with a warning).
ALLOW_UNTESTED_ENV = "DSPARK_ALLOW_UNTESTED_VLLM"


def series(version: str) -> str:
    """`0.32.0` -> `0.32`: the release series, the part the policy accepts with a warning."""
    return ".".join(version.split("+", 1)[0].split(".")[:2])


PINNED_SERIES = series(PINNED_VERSION)


@dataclass(frozen=True)
class VersionVerdict:
    """What the policy says of one installed vLLM: `refusal` (None when accepted) and `warning`."""

    version: str
    refusal: str | None = None
    warning: str | None = None

    @property
    def accepted(self) -> bool:
        return self.refusal is None

    @property
    def untested(self) -> bool:
        return self.version != PINNED_VERSION


def untested_allowed() -> bool:
    """Whether the environment allows a vLLM outside the pinned series (`DSPARK_ALLOW_UNTESTED_VLLM=1`)."""
    return os.environ.get(ALLOW_UNTESTED_ENV, "").strip() not in ("", "0")


def judge_version(version: str) -> VersionVerdict:
    """The policy (see the module docstring) applied to an installed vLLM's `__version__`."""
    if version == PINNED_VERSION:
        return VersionVerdict(version)
    if series(version) == PINNED_SERIES:
        return VersionVerdict(version, warning=f"ran vLLM {version}; dspark-hub is tested with vLLM {PINNED_VERSION} "
                                               f"(other {PINNED_SERIES}.x releases are accepted)")
    if untested_allowed():
        return VersionVerdict(version, warning=f"ran vLLM {version}, outside the tested {PINNED_SERIES} series "
                                               f"({ALLOW_UNTESTED_ENV} is set); dspark-hub is tested with vLLM "
                                               f"{PINNED_VERSION}")
    return VersionVerdict(version, refusal=f"vLLM {version} is outside the tested {PINNED_SERIES} series (dspark-hub "
                                           f"is built against vLLM {PINNED_VERSION} and hooks its internals); install "
                                           f"vLLM {PINNED_VERSION}, or set {ALLOW_UNTESTED_ENV}=1 to run it anyway")
