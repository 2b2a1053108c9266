"""Every exception dspark-hub raises, under one root.

Errors mean "the operation could not run". Problems found *in* a checkpoint are
not exceptions: they are `Finding`s in a `Report` (see `report.py`).

Each class carries the data a caller needs and an `exit_code` for the CLI
boundary (2 = usage or I/O error, the check could not run).
"""

from __future__ import annotations


class DsparkError(Exception):
    """Root of every dspark-hub error. `str(e)` is one line naming the thing and the fix.

    Example: ``ckpt/config.json: not found; pass a checkpoint folder that holds config.json``
    """

    exit_code: int = 2

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint


class ContractError(DsparkError, ValueError):
    """A config cannot be turned into a roster (missing or ill-typed contract key).

    Example: ``config.json: 'num_hidden_layers' must be a positive integer, got "5"``
    """

    def __init__(self, message: str, *, key: str | None = None, hint: str | None = None) -> None:
        super().__init__(message, hint=hint)
        self.key = key


class CheckpointFormatError(DsparkError, ValueError):
    """The strict safetensors reader's only exception. `code` is a stable identifier.

    Example: ``model.safetensors: tensor 'final_norm.weight' data_offsets [0, 10] cover 10 bytes, shape [8] x BF16 needs 16``
    """

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


class MissingDependencyError(DsparkError, ImportError):
    """An optional heavy dependency (torch, transformers, ...) is not installed.

    Example: ``finetune needs torch; pip install 'dspark-hub[train]'``
    """


class RefusedOverwriteError(DsparkError, FileExistsError):
    """A writer would replace an existing output without ``--force``.

    Example: ``out/: already exists; pass --force to replace it``
    """

    def __init__(self, path: str) -> None:
        super().__init__(f"{path}: already exists; pass --force to replace it")
        self.path = path


class EngineError(DsparkError, RuntimeError):
    """A teacher engine failed or refused a request (its process died, or it rejected the teacher).

    Example: ``vllm engine: ValueError: max_model_len 4096 exceeds the teacher's 512 (log: /tmp/dspark-vllm-x/engine.log)``
    """


class HubError(DsparkError, OSError):
    """A Hub operation failed (not found, unauthorized, network).

    Example: ``hf://org/name: repository not found or not readable with this token; check the name or run 'hf auth login'``
    """


class UsageError(DsparkError, ValueError):
    """Arguments that cannot work together, or a value of the wrong form.

    Example: ``--drop-in: 'kimi-k4' is neither a bundled reference (kimi-k3) nor a checkpoint folder``
    """
