"""Run the dspark-hub CLI in a process of its own that stops, once, at a hook point a test chooses.

    python tests/paused_cli.py MODULE:FUNCTION ARGS...      (PAUSE_FDS="READ,WRITE" in the environment)

Before the first call of `MODULE.FUNCTION` the process writes "paused" on the descriptor WRITE and
waits for a line on READ, then calls the function and goes on. A test thereby knows (by reading a
pipe, not by sleeping) that the command is exactly there, does what another process would do at
that moment, and lets it go on. `Paused` is the test's side.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import os
import select
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
#: How long a test waits for the other process to reach the hook point or to finish (a hang guard only).
PATIENCE = 300


def _pause_before(module: str, name: str) -> None:
    read, write = (int(fd) for fd in os.environ["PAUSE_FDS"].split(","))
    owner = importlib.import_module(module)
    original = getattr(owner, name)
    done: list[bool] = []

    @functools.wraps(original)
    def paused(*args: Any, **kwargs: Any) -> Any:
        if not done:
            done.append(True)
            os.write(write, b"paused\n")
            os.read(read, 64)
        return original(*args, **kwargs)

    setattr(owner, name, paused)


class Paused:
    """The dspark-hub command `args`, started in its own process, stopping before `hook` (`module:function`)."""

    def __init__(self, hook: str, *args: object, cwd: Path | None = None, env: dict[str, str] | None = None) -> None:
        self._from_child, child_write = os.pipe()
        child_read, self._to_child = os.pipe()
        environment = {**os.environ, **(env or {}), "PYTHONPATH": str(ROOT), "PAUSE_FDS": f"{child_read},{child_write}"}
        self.process = subprocess.Popen([sys.executable, str(Path(__file__)), hook, *map(str, args)], cwd=cwd,
                                        env=environment, pass_fds=(child_read, child_write), text=True,
                                        stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        os.close(child_read)
        os.close(child_write)

    def wait_paused(self) -> None:
        """Return once the command stands at the hook point (fails if it ends first)."""
        ready, _, _ = select.select([self._from_child], [], [], PATIENCE)
        line = os.read(self._from_child, 64) if ready else b""
        if line != b"paused\n":
            out, err = self.finish()
            raise AssertionError(f"the command did not reach its hook point (exit {self.process.returncode}): "
                                 f"{out}{err}")

    def go_on(self) -> subprocess.CompletedProcess[str]:
        """Let the command continue; returns how it ended."""
        os.write(self._to_child, b"go\n")
        out, err = self.finish()
        return subprocess.CompletedProcess(self.process.args, self.process.returncode, out, err)

    def finish(self) -> tuple[str, str]:
        try:
            return self.process.communicate(timeout=PATIENCE)
        finally:
            for fd in (self._from_child, self._to_child):
                with contextlib.suppress(OSError):
                    os.close(fd)


def main() -> None:
    hook, *args = sys.argv[1:]
    module, name = hook.split(":")
    _pause_before(module, name)
    from dspark_hub.cli.main import main as cli_main

    sys.argv = ["dspark-hub", *args]
    cli_main()


if __name__ == "__main__":
    main()
