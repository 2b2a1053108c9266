"""Every exception dspark-hub raises, under one root.

Errors mean "the operation could not run". Problems found *in* a checkpoint are
not exceptions: they are `Finding`s in a `Report` (see `report.py`).

Each class carries the data a caller needs, a stable `error_code` and an `exit_code` for the
CLI boundary (2 = usage or I/O error, the check could not run).

Messages are one line, `<file|tensor|key>: <what is wrong>; <what to do>`, in library terms:
they never name a command-line flag. An error about one argument says which with
`param="target"` (the Python name); a message that names other arguments writes them in
backticks, `` `target` ``. The CLI turns both into its flags (`--target`, `--teacher`), and adds
"pass --force to replace it" to a `RefusedOverwriteError`. A message may quote a whole command
a reader can run, `'dspark-hub checksums --force'`: that is advice, true whoever called.
(`tests/test_errors.py` walks every string of the library to keep it so.)
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

#: Names of 0.2 that still resolve, with a `DeprecationWarning` (until 0.4).
RENAMED = {"TeacherMismatchError": "TargetMismatchError"}


class DsparkError(Exception):
    """Root of every dspark-hub error. `str(e)` is one line naming the thing and the fix.

    Example: ``ckpt/config.json: not found; pass a checkpoint folder that holds config.json``
    """

    exit_code: int = 2
    #: Stable identifier of the error type (the `code` of the CLI's error JSON).
    error_code: str = "ERROR"

    def __init__(self, message: str, *, hint: str | None = None, param: str | None = None) -> None:
        text = message + (f"; {hint}" if hint else "")
        super().__init__(f"{param}: {text}" if param else text)
        self.message = message
        self.hint = hint
        #: The argument (Python name) the message is about; `str(e)` starts with it.
        self.param = param


@contextmanager
def about(param: str) -> Iterator[None]:
    """Errors raised inside are about the argument `param` (unless they already name one).

    For a path argument opened by shared code (`open_checkpoint`, `locate_tensor`) that cannot
    know which argument it serves: `with about("target"): open_checkpoint(...)`.
    """
    try:
        yield
    except DsparkError as e:
        if e.param is None:
            e.param = param
            e.args = (f"{param}: {e.args[0]}", *e.args[1:]) if e.args else (param,)
        raise


class ContractError(DsparkError, ValueError):
    """A config cannot be turned into a roster (missing or ill-typed contract key).

    Example: ``config.json: 'num_hidden_layers' must be a positive integer, got "5"``
    """

    error_code = "CONTRACT"

    def __init__(self, message: str, *, key: str | None = None, hint: str | None = None) -> None:
        super().__init__(message, hint=hint)
        self.key = key


class CheckpointFormatError(DsparkError, ValueError):
    """The strict safetensors reader's only exception. `code` is a stable identifier.

    Example: ``model.safetensors: tensor 'final_norm.weight' data_offsets [0, 10] cover 10 bytes, shape [8] x BF16 needs 16``
    """  # noqa: E501 (the example is one line, as the message is)

    error_code = "CHECKPOINT_FORMAT"

    def __init__(self, code: str, message: str, *, path: str | None = None,
                 tensor: str | None = None, hint: str | None = None) -> None:
        where = path or "<bytes>"
        super().__init__(f"{where}: {message}", hint=hint)
        self.code = code
        self.path = path
        self.tensor = tensor
        self.detail = message


class CheckpointNotFoundError(DsparkError, FileNotFoundError):
    """The path given is not a checkpoint folder (or file) we can read.

    Example: ``./ckpt: no such file or directory; pass a checkpoint folder``
    """

    error_code = "NOT_FOUND"


class MissingDependencyError(DsparkError, ImportError):
    """An optional heavy dependency (torch, transformers, ...) is not installed.

    Example: ``finetune needs torch; pip install 'dspark-hub[train]'``
    """

    error_code = "MISSING_DEPENDENCY"


class RefusedOverwriteError(DsparkError, FileExistsError):
    """A writer would replace an existing output, and `force` was not given.

    `detail` says why when the output exists in a way that matters (default: "already exists").
    The CLI adds the hint "pass --force to replace it".

    Example: ``out/: already exists``
    """

    error_code = "REFUSED_OVERWRITE"

    def __init__(self, path: str, detail: str = "already exists") -> None:
        super().__init__(f"{path}: {detail}")
        self.path = path
        self.detail = detail


class ChangedMeanwhileError(DsparkError):
    """Something the command checked changed before it was used: another process wrote, replaced or
    removed it meanwhile (an output `force` was to replace, a file the publish gate judged).

    Example: ``out/: changed since it was checked (another process wrote, replaced or removed it while
    this ran); it was kept and this output not written; run again``
    """

    error_code = "CHANGED_MEANWHILE"


class EngineError(DsparkError, RuntimeError):
    """A target engine failed or refused a request (its process died, or it rejected the target).

    Example: ``vllm engine: ValueError: max_model_len 4096 exceeds the target's 512
    (log: /tmp/dspark-vllm-x/engine.log)``
    """

    error_code = "ENGINE"


class TargetMismatchError(DsparkError):
    """The target and the draft's config disagree on a pairing key (hidden size, layers, vocabulary).

    Example: ``toy/target: hidden_size is 64, the draft's target_hidden_size is 128; pair the draft with the
    target it was built for``
    """

    error_code = "TARGET_MISMATCH"


class HubError(DsparkError, OSError):
    """A Hub operation failed (not found, unauthorized, network).

    Example: ``hf://org/name: repository not found or not readable with this token; check the name or run 'hf auth login'``
    """  # noqa: E501 (the example is one line, as the message is)

    error_code = "HUB"


class UsageError(DsparkError, ValueError):
    """Arguments that cannot work together, or a value of the wrong form.

    Example: ``UsageError("'kimi-k4' is neither a bundled reference (kimi-k3) nor a checkpoint folder",
    param="drop_in")``: `str(e)` starts with `drop_in: `, the CLI shows `--drop-in: `.
    """

    error_code = "USAGE"


class ConversionRefusedError(UsageError):
    """`convert` will not write this checkpoint: it is of another draft family, or the mapping between
    formats is not lossless. `family` is the detected family (`verify.family`), `target` the format asked
    for, `detail` the analysis as data (e.g. `ops.crosswalk.Crosswalk.to_dict()`).

    Example: ``src: a speculators-format DSpark checkpoint; converting it to k3_dspark is not lossless:
    layers.{0..1}.self_attn.q_proj.weight, ... have no counterpart in the k3_dspark layout``
    """

    error_code = "CONVERSION_REFUSED"

    def __init__(self, message: str, *, family: str, target: str, detail: dict[str, Any] | None = None,
                 hint: str | None = None) -> None:
        super().__init__(message, hint=hint)
        self.family = family
        self.target = target
        self.detail = detail or {}


class VllmNotAvailable(UsageError):
    """vLLM is not importable in this Python (`verify`'s execution of vLLM's loader needs it here).

    Example: ``execute: vLLM is not importable in /usr/bin/python3; install vLLM 0.32.0 in that Python (...)``
    """

    error_code = "VLLM_NOT_AVAILABLE"


class VllmInternalsMoved(DsparkError):
    """The installed vLLM lacks an internal the loader execution hooks (a newer or older release).

    Example: ``vLLM 0.33.0 lacks what the execution engine hooks (built against vLLM 0.32.0): DefaultModelLoader...``
    """

    error_code = "VLLM_INTERNALS_MOVED"


class ExecutionFailed(DsparkError):
    """The loader execution itself failed (not vLLM's verdict on the draft): its child process died, or a bug.

    Example: ``the vLLM child process exited (exit status -9) during execute: Killed; log: /tmp/.../child.log``
    """

    error_code = "EXECUTION_FAILED"


def __getattr__(name: str) -> Any:
    """An old name (`RENAMED`): the class it became, with a `DeprecationWarning`."""
    if name in RENAMED:
        warnings.warn(f"dspark_hub.errors.{name} is {RENAMED[name]} since 0.3; the old name goes in 0.4",
                      DeprecationWarning, stacklevel=2)
        return globals()[RENAMED[name]]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
