"""The options of a `finetune` run (`TrainConfig`).

Torch-free: the command line builds its `finetune` options from `TrainConfig`'s fields (their
defaults are typed once, here), and `--help` must not import torch. Dtypes in either spelling
(`target.dtypes.canonical_dtype`).
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Iterable
from dataclasses import MISSING, asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from dspark_hub._compat import renamed_keywords
from dspark_hub.errors import UsageError
from dspark_hub.format.provenance import TRAINING_ARGS_PATHS, public_args
from dspark_hub.format.writer import refuse_own_inputs
from dspark_hub.train.finetuning import objective
from dspark_hub.train.target.dtypes import canonical_dtype
from dspark_hub.train.target.engines import DEFAULT_ENGINE, EngineOptions

#: What `finetune` trains in: fp32 master weights, the forward in fp32 or under bf16 autocast.
TRAIN_DTYPES = ("float32", "bfloat16")


def check_betas(betas: Iterable[float]) -> tuple[float, float]:
    """AdamW's two moment decays, each in [0, 1).

    Raises:
        UsageError: not two numbers in [0, 1).
    """
    values = tuple(betas)
    if len(values) != 2 or not all(isinstance(b, (int, float)) and not isinstance(b, bool) and 0 <= b < 1
                                   for b in values):
        raise UsageError(f"{values}; give two numbers in [0, 1), e.g. 0.9,0.95", param="betas")
    return float(values[0]), float(values[1])


@dataclass
class TrainConfig:
    """Every `finetune` option (see `dspark-hub finetune --help`, whose defaults are these)."""

    base: str
    out: str
    data: str | None = None
    steps: int | None = None
    epochs: float | None = None
    lr: float = 3e-4
    min_lr_ratio: float = 0.1
    warmup: int = 0
    batch_size: int = 8
    block_size: int = 7
    max_anchors: int = 512
    loss_chunk: int = objective.DEFAULT_LOSS_CHUNK
    loss: dict[str, float] = field(default_factory=lambda: {"ce": 0.1, "tv": 0.9})
    gamma: float = 4.0
    alpha: float = 1.0
    confidence_target: str = "overlap"   # what the confidence head learns (`objective.CONFIDENCE_TARGETS`)
    clip: float = 1.0
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.95)   # AdamW's moment decays
    dtype: str = "float32"
    seed: int = 0
    save_every: int = 0
    keep_states: int = 2
    resume: bool = False
    state_dir: str | None = None
    target: str | None = None     # the target (its lm_head; its rollouts on-policy); `--target` on the command line
    on_policy: bool = False
    rounds: int = 1
    prompts: str | None = None
    max_new_tokens: int = 256
    eval_data: str | None = None
    eval_every: int = 0
    fsdp: bool = False
    dist_timeout: float = 120.0   # minutes a rank waits in a collective (rank 0's on-policy rollouts)
    force: bool = False
    device: str | None = None
    engine: str = DEFAULT_ENGINE
    engine_options: EngineOptions = field(default_factory=EngineOptions)
    data_layer_ids: list[int] | None = None

    def __post_init__(self) -> None:
        self.dtype = canonical_dtype(self.dtype, TRAIN_DTYPES)
        if self.confidence_target not in objective.CONFIDENCE_TARGETS:
            raise UsageError(f"confidence target {self.confidence_target!r}; use one of "
                             f"{', '.join(objective.CONFIDENCE_TARGETS)}", param="confidence_target")
        self.betas = check_betas(self.betas)

    def __getattr__(self, name: str) -> Any:
        """`config.teacher`, the 0.2 name of `target`, with a DeprecationWarning (until 0.4)."""
        if name == "teacher":
            warnings.warn("TrainConfig.teacher is .target since 0.3; the old name goes in 0.4", DeprecationWarning,
                          stacklevel=2)
            return self.target
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    @property
    def bf16(self) -> bool:
        """The forward runs under bf16 autocast (over fp32 master weights)."""
        return self.dtype == "bfloat16"

    def to_dict(self) -> dict[str, Any]:
        """The options; `target` under its JSON key `teacher` (training_args.json keeps the key readers know)."""
        return {("teacher" if key == "target" else key): value for key, value in asdict(self).items()}

    def public_dict(self) -> dict[str, Any]:
        """`to_dict()` as published in `training_args.json`: Hub ids or digests instead of local paths."""
        return public_args(self.to_dict(), TRAINING_ARGS_PATHS, drop=("out", "state_dir"), weights=("base",))

    @property
    def state_path(self) -> Path:
        return Path(self.state_dir) if self.state_dir else Path(f"{self.out}.state")

    def refuse_own_inputs(self, target: str | None = None) -> None:
        """Refuse an `out` or state folder that is, holds or sits inside an input (`target`: the one the
        data names, when not given), or a state folder inside `out` (replacing `out` would delete it).

        Raises:
            UsageError: naming the two arguments, with or without `force`.
        """
        inputs = [("base", self.base), ("data", self.data), ("target", self.target or target),
                  ("prompts", self.prompts), ("eval_data", self.eval_data),
                  ("engine_python", self.engine_options.python)]
        refuse_own_inputs(self.out, inputs, param="out", folder=True)
        if self.uses_state_dir:
            refuse_own_inputs(self.state_path, inputs, param="state_dir", folder=True)
            out, states = Path(self.out).resolve(), self.state_path.resolve()
            if states == out or states.is_relative_to(out):
                raise UsageError(f"{self.state_path}: is (inside) `out` ({self.out}), which the run replaces at "
                                 "its end; keep the states in another folder", param="state_dir")

    @property
    def uses_state_dir(self) -> bool:
        """States are asked for (`save_every`, `resume`, an explicit `state_dir`), or on-policy rounds keep
        their rollouts there."""
        return bool(self.save_every or self.resume or self.state_dir or self.on_policy)



# `TrainConfig(teacher=...)`, the 0.2 keyword of `target`: accepted with a DeprecationWarning until 0.4 (outside
# the fields, so `dataclasses.replace` and `asdict` never see it).
TrainConfig.__init__ = renamed_keywords(teacher="target")(TrainConfig.__init__)  # type: ignore[method-assign]

def default(name: str) -> Any:
    """`TrainConfig`'s default for the field `name` (a factory's value is made; `loss` as its JSON text)."""
    (found,) = [f for f in fields(TrainConfig) if f.name == name]
    if found.default_factory is not MISSING:
        value = found.default_factory()
        return json.dumps(value, separators=(",", ":")) if name == "loss" else value
    if found.default is MISSING:
        raise KeyError(f"TrainConfig.{name} has no default")
    return found.default
