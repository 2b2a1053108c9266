"""On-policy rounds (`on_policy=True, rounds=K`): the target's rollouts and the draft's updates, alternating.

The prompts are split into K rounds; each round the target greedily continues that round's prompts
(`dspark_hub.train.data.rollouts`, resumable, under `state_dir/round-NNN/`) in the target engine
`engine` (`transformers` or `vllm`), the engine releases its memory (vLLM: sleep mode where the
platform has it, else its process stops; the log says which), then the draft trains on those
cached states for its share of the steps. Rank 0 runs the engine; the other ranks wait.

"On-policy" is the target's policy: under greedy speculative decoding the emitted tokens are the
target's greedy tokens whatever the draft proposes, so the target's own greedy continuations ARE
the serving distribution (dspark-algorithm.md §2.8; the SDDD card's batch-alternating scheduler);
the draft never decodes inside the loop.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

from dspark_hub.format.writer import write_file
from dspark_hub.train.data.checks import prompt_lines as read_prompt_lines
from dspark_hub.train.data.rollouts import RolloutData, make_rollouts
from dspark_hub.train.finetuning.checkpointer import Checkpointer
from dspark_hub.train.finetuning.config import TrainConfig
from dspark_hub.train.finetuning.distributed import barrier
from dspark_hub.train.target.engines import TargetEngine, open_engine
from dspark_hub.train.target.target import Target


class Trainer(Protocol):
    """What the rounds use of `trainer.Trainer`."""

    config: TrainConfig
    target: Target
    rank: int
    base_config: dict[str, Any]
    checkpointer: Checkpointer
    total_steps: int
    step: int
    releases: list[str]

    def log(self, entry: dict[str, Any]) -> None: ...

    def run_steps(self, data: RolloutData, start: int, stop: int, round_index: int | None = None) -> None: ...


def prompt_lines(path: str) -> list[str]:
    """The non-blank lines of a prompts file (strict UTF-8, never opened unless regular: `data.checks.prompt_lines`)."""
    return [line for _, line in read_prompt_lines(path)]


def share(total: int, parts: int, index: int) -> tuple[int, int]:
    """`[start, stop)` of part `index` when `total` items are split into `parts` near-equal runs."""
    return total * index // parts, total * (index + 1) // parts


def fit_on_policy(trainer: Trainer) -> None:
    """Run every round not yet done (a resumed run skips the rounds its steps already cover)."""
    config = trainer.config
    assert config.prompts   # checked when the trainer was made
    lines = prompt_lines(config.prompts)
    rounds = max(1, min(config.rounds, len(lines)))
    engine: TargetEngine | None = None
    if trainer.rank == 0:
        engine = open_engine(config.engine, trainer.target, list(trainer.base_config["target_layer_ids"]),
                             config.engine_options, releasable=rounds > 1)
    trainer.checkpointer.make_dir()     # after the engine was accepted
    try:
        for r in range(rounds):
            start, stop = share(trainer.total_steps, rounds, r)
            if trainer.step >= stop:
                continue
            folder = trainer.checkpointer.require_dir() / f"round-{r:03d}"
            if engine is not None:
                start_line, stop_line = share(len(lines), rounds, r)
                roll_out(trainer, engine, folder, lines[start_line:stop_line])
                if r + 1 < rounds:        # free the target's memory for the draft's updates
                    action = engine.release()
                    trainer.releases.append(action)
                    trainer.log({"step": trainer.step, "round": r, "engine": engine.name, "release": action})
            barrier()
            trainer.run_steps(RolloutData(folder / "data"), start, stop, round_index=r)
    finally:
        if engine is not None:
            engine.close()


def roll_out(trainer: Trainer, engine: TargetEngine, folder: Path, chunk: list[str]) -> None:
    """One round's rollouts: its prompts to `folder/prompts.jsonl`, the target's continuations to `folder/data`."""
    config = trainer.config
    folder.mkdir(parents=True, exist_ok=True)
    write_file(folder / "prompts.jsonl", "".join(line + "\n" for line in chunk))
    make_rollouts(trainer.target, folder / "prompts.jsonl", trainer.base_config, folder / "data",
                  max_new_tokens=config.max_new_tokens, engine=engine)
