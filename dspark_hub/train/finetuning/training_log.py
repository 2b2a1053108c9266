"""The JSON-lines training log (`training_log.jsonl`), kept by rank 0.

One line per step (step, loss terms, lr, grad norm, tokens, step seconds, tokens/s, peak device
memory) and per event (eval results, an engine release). It lives in the state folder when the
run has one (so a resumed run continues it, cut back to the state's step), else in memory; the
output gets a copy.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
from pathlib import Path
from typing import Any

from dspark_hub.errors import UsageError
from dspark_hub.format.folder import read_regular
from dspark_hub.format.jsonio import loads_strict
from dspark_hub.format.writer import write_file, writing

LOG_NAME = "training_log.jsonl"
#: Log keys that measure the machine (time, memory): they differ between runs that train identically.
MEASURED = ("step_seconds", "tokens_per_second", "peak_memory_bytes")


class TrainingLog:
    """The log of one run: `state_dir/training_log.jsonl`, or memory when `state_dir` is None.

    Only rank 0 writes; the other ranks' calls do nothing.
    """

    def __init__(self, state_dir: Path | None, rank: int) -> None:
        self.path = None if state_dir is None else state_dir / LOG_NAME
        self.rank = rank
        self._lines: list[str] = []          # the log, when there is no state folder to keep it in

    def restart(self) -> None:
        """A fresh run: forget a log an earlier run left in the state folder."""
        if self.rank == 0 and self.path is not None:
            self.path.unlink(missing_ok=True)

    def append(self, entry: dict[str, Any]) -> None:
        """Append a line (rank 0 only)."""
        if self.rank != 0:
            return
        line = json.dumps(entry) + "\n"
        if self.path is None:
            self._lines.append(line)
            return
        with writing(self.path), open(self.path, "a", encoding="utf-8") as handle:
            handle.write(line)

    def text(self) -> str:
        """The log so far (what the output's `training_log.jsonl` will hold)."""
        if self.path is None:
            return "".join(self._lines)
        return self.path.read_text(encoding="utf-8") if self.path.is_file() else ""

    def truncate(self, step: int) -> None:
        """Drop the lines after `step` (a resumed run repeats them); rank 0 only.

        Raises:
            UsageError: the log is not a regular file of the state folder (a link is never followed,
                a FIFO never opened), or a line is not a JSON object with an integer `step`.
        """
        if self.rank != 0 or self.path is None or not os.path.lexists(self.path):
            return
        fix = "the training log is a file of its own state folder, one JSON object a line; remove it or fix it"
        if not stat.S_ISREG(os.lstat(self.path).st_mode):
            raise UsageError(f"{self.path}: is not a regular file (a link, or a special file); {fix}",
                             param="state_dir")
        kept = []
        for number, line in enumerate(read_regular(self.path).decode("utf-8", "replace").splitlines(), 1):
            entry = loads_strict(line, path=f"{self.path}:{number}")
            if not (isinstance(entry, dict) and type(entry.get("step")) is int):
                raise UsageError(f"{self.path}:{number}: not a log line (a JSON object with an integer step); {fix}",
                                 param="state_dir")
            if entry["step"] <= step:
                kept.append(line)
        write_file(self.path, "".join(line + "\n" for line in kept))

    def copy_into(self, folder: Path) -> None:
        """Write the log into the output `folder` (nothing when nothing was logged)."""
        if self.path is not None and self.path.is_file():
            shutil.copyfile(self.path, folder / LOG_NAME)
        elif self._lines:
            write_file(folder / LOG_NAME, "".join(self._lines))
