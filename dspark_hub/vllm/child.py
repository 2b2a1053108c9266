"""A Python child process in vLLM's virtualenv: its launch, its JSON-lines protocol, its log, its errors.

Why a child: vLLM patches torch for its whole process when imported (thread count, CUDA events,
pinned memory), takes seconds to import, keeps process-wide state (distributed groups, its engine
core), and pins torch and transformers versions the caller need not share; on CPU, ending the
process is the only complete release of its memory.

Launch (`Child.start`): `PYTHON -m MODULE` in a scratch folder, PYTHON being any interpreter (this
one by default; e.g. the one `.ci/venv-vllm.sh` builds). Only `dspark_hub` is made importable there:
a folder holding a link to this package goes first on `PYTHONPATH` (dspark_hub need not be installed
there, and the folder it is installed in, maybe another virtualenv's site-packages, never goes on the
path). vLLM's engine core stays in the child (`VLLM_ENABLE_V1_MULTIPROCESSING=0`); usage stats are off.

Protocol: one JSON object per line. The parent writes a request, `{"op": ..., ...}`, on the child's
stdin; the child answers each with one line on its original stdout, `{"ok": true, ...}` or
`{"ok": false, "error": {"type", "message", "param"}}`. `serve` (the child's loop) sends the child's
own stdout to its stderr before anything runs, so vLLM's printing never corrupts a reply; stderr goes
to the log, `child.log` in the scratch folder. `{"op": "exit"}` ends the child, after its reply.

Errors: a reply's error that names a class of `REMOTE_ERRORS` is raised here as that class, with the
child's message and argument; anything else the child raised, a child that exits without answering,
or one that does not answer in time, is the caller's `failure` class, naming the log (kept).
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import shutil
import subprocess
import sys
import tempfile
import traceback
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from dspark_hub.errors import (
    DsparkError,
    EngineError,
    ExecutionFailed,
    MissingDependencyError,
    UsageError,
    VllmInternalsMoved,
    VllmNotAvailable,
)
from dspark_hub.format.jsonio import loads_strict
from dspark_hub.vllm.availability import INSTALL_HINT

#: The errors a child reports by class name and the parent raises as such (the rest is the caller's `failure`).
REMOTE_ERRORS: dict[str, type[DsparkError]] = {
    cls.__name__: cls for cls in (MissingDependencyError, UsageError, EngineError, VllmNotAvailable,
                                  VllmInternalsMoved, ExecutionFailed)}
#: What every child's environment says: vLLM's engine core in the process, no usage reporting.
CHILD_ENV = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"}
LOG_NAME = "child.log"


def log_tail(path: Path | None, lines: int = 1, *, width: int = 300) -> str:
    """The last `lines` non-blank lines of a log (each cut to `width`), or ``no output``."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace") if path is not None else ""
    except OSError:
        text = ""
    kept = [line.rstrip()[:width] for line in text.splitlines() if line.strip()][-lines:]
    return "\n".join(kept) if kept else "no output"


def package_link(folder: Path) -> Path:
    """`folder/path/dspark_hub` -> this package; returns the folder to put on the child's `PYTHONPATH`."""
    path_dir = folder / "path"
    path_dir.mkdir(parents=True, exist_ok=True)
    link = path_dir / "dspark_hub"
    if not link.exists():
        link.symlink_to(Path(__file__).resolve().parents[1], target_is_directory=True)
    return path_dir


class Child:
    """One child process speaking the protocol (see the module docstring).

    Args:
        module: what the child runs (`python -m module`); it calls `serve`.
        what: the process in messages (``the vllm engine``).
        python: the child's interpreter (default: this one).
        env: added to the child's environment (on top of this process's and `CHILD_ENV`).
        failure: the error for a child that failed without a typed error.
        python_param: the argument that named `python`, for a "cannot start" or missing-vLLM error.
    """

    def __init__(self, module: str, *, what: str, python: str | None = None, env: Mapping[str, str] | None = None,
                 failure: type[DsparkError] = EngineError, python_param: str | None = None) -> None:
        self.module = module
        self.what = what
        self.python = python or sys.executable
        self.env = dict(env or {})
        self.failure = failure
        self.python_param = python_param
        self.workdir = Path(tempfile.mkdtemp(prefix="dspark-vllm-"))
        self.log_path = self.workdir / LOG_NAME
        self.process: subprocess.Popen[str] | None = None

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def start(self) -> None:
        """Start the child (a no-op when it runs).

        Raises:
            MissingDependencyError: the interpreter cannot be started.
        """
        if self.running:
            return
        inherited = [os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else []
        env = {**os.environ, **CHILD_ENV, **self.env,
               "PYTHONPATH": os.pathsep.join([str(package_link(self.workdir)), *inherited])}
        if self.python != sys.executable:
            env.pop("PYTHONHOME", None)
        with open(self.log_path, "a", encoding="utf-8") as log:
            try:
                self.process = subprocess.Popen([self.python, "-m", self.module], stdin=subprocess.PIPE,
                                                stdout=subprocess.PIPE, stderr=log, text=True, env=env,
                                                cwd=self.workdir)
            except OSError as exc:
                raise MissingDependencyError(f"{self.python}: cannot start the {self.what} process "
                                             f"({exc.strerror}); {INSTALL_HINT}", param=self.python_param) from None

    def request(self, request: Mapping[str, Any], *, timeout: float | None = None) -> dict[str, Any]:
        """Send one request and return the child's `ok` reply (the child must be running).

        Raises:
            the reply's error class (`REMOTE_ERRORS`), or `failure` (the child exited, failed or timed out).
        """
        process = self.process
        if process is None or process.stdin is None or process.stdout is None:
            raise self.failure(f"the {self.what} process is not running ({request.get('op')})")
        try:
            process.stdin.write(json.dumps(request) + "\n")
            process.stdin.flush()
            line = self._read_line(process, timeout, request.get("op"))
        except BrokenPipeError:
            line = ""
        if not line:
            process.wait()
            self.process = None
            raise self.failure(f"the {self.what} process exited (exit status {process.returncode}) during "
                               f"{request.get('op')}: {log_tail(self.log_path, 15)}; log: {self.log_path}")
        reply = loads_strict(line, path=f"the {self.what} process's reply")
        if not isinstance(reply, dict) or not reply.get("ok"):
            raise self.error(reply.get("error") if isinstance(reply, dict) else None)
        return reply

    def _read_line(self, process: subprocess.Popen[str], timeout: float | None, op: object) -> str:
        assert process.stdout is not None
        if timeout is not None and not select.select([process.stdout], [], [], timeout)[0]:
            process.kill()
            process.wait()
            self.process = None
            raise self.failure(f"the {self.what} process did not answer {op} in {timeout:g} s: "
                               f"{log_tail(self.log_path, 15)}; log: {self.log_path}")
        return process.stdout.readline()

    def error(self, error: object) -> DsparkError:
        """A reply's error as the exception to raise here."""
        fields = error if isinstance(error, dict) else {"message": str(error)}
        message = str(fields.get("message", "no message"))
        cls = REMOTE_ERRORS.get(str(fields.get("type")))
        if cls is None:
            return self.failure(f"{self.what}: {message} (log: {self.log_path})")
        param = fields.get("param")
        if param is None and cls is MissingDependencyError:
            param = self.python_param
        return cls(message, param=param if isinstance(param, str) else None)

    def stop(self, timeout: float = 60.0) -> dict[str, Any] | None:
        """End the child (asks it to exit, then waits; kills it after `timeout`); its `exit` reply, if any."""
        process, self.process = self.process, None
        if process is None:
            return None
        reply = None
        if process.poll() is None and process.stdin is not None and process.stdout is not None:
            with contextlib.suppress(OSError, ValueError, DsparkError):
                process.stdin.write(json.dumps({"op": "exit"}) + "\n")
                process.stdin.flush()
                line = process.stdout.readline()
                reply = loads_strict(line, path=f"the {self.what} process's reply") if line else None
            try:
                process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        for stream in (process.stdin, process.stdout):
            if stream is not None:
                stream.close()
        return reply

    def remove(self) -> None:
        """Delete the scratch folder and its log (after a success; a failure's log is worth keeping)."""
        shutil.rmtree(self.workdir, ignore_errors=True)


@contextlib.contextmanager
def session(child: Child, *, stop_timeout: float = 60.0) -> Iterator[Child]:
    """`child`, started; stopped on leaving, its folder deleted unless it failed (the log then stays)."""
    child.start()
    try:
        yield child
    except BaseException as exc:
        child.stop(stop_timeout)
        if not isinstance(exc, child.failure):
            child.remove()
        raise
    child.stop(stop_timeout)
    child.remove()


def error_reply(exc: BaseException) -> dict[str, Any]:
    """The `ok: false` reply for an exception raised in the child (a traceback goes to the log for a bug)."""
    if isinstance(exc, DsparkError):
        message = exc.message + (f"; {exc.hint}" if exc.hint else "")
        return {"ok": False, "error": {"type": type(exc).__name__, "message": message, "param": exc.param}}
    traceback.print_exc()
    first = (str(exc).strip().splitlines() or [""])[0]
    return {"ok": False, "error": {"type": "bug", "message": f"{type(exc).__name__}: {first}"}}


def serve(handle: Callable[[dict[str, Any]], dict[str, Any]]) -> None:
    """The child's loop: one reply line per request line, until `exit` or the end of stdin."""
    protocol = os.fdopen(os.dup(1), "w", buffering=1, encoding="utf-8")
    sys.stdout.flush()
    os.dup2(2, 1)       # anything printed (vLLM's logs included) goes to the log, never into a reply
    for line in sys.stdin:
        if not line.strip():
            continue
        op = None
        try:
            request = loads_strict(line, path="request")
            op = request.get("op")
            reply = {"ok": True, **handle(request)}
        except Exception as exc:
            reply = error_reply(exc)
        protocol.write(json.dumps(reply) + "\n")
        protocol.flush()
        if op == "exit":
            break
