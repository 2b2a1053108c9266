"""Every schema id dspark-hub writes, in one place (docs/commands.md lists them, generated from here).

A command's `--json` document is `dspark-hub/<command>/<version>`, where `<command>` is the
command path joined with `-` (`golden check` -> `golden-check`). Files dspark-hub writes for
other tools to read carry their own ids. Bump a version only when a key changes meaning or
disappears; adding keys keeps it.
"""

from __future__ import annotations

#: `--json` output of each command.
COMMANDS: dict[str, str] = {name: f"dspark-hub/{name}/1" for name in (
    "verify", "diff", "convert", "init", "init-teacher", "rollouts", "finetune", "golden-write", "golden-check",
    "export-code", "checksums", "checksums-check", "package", "card", "card-lint", "publish", "error", "compare",
    "probe",
)} | {
    # 2: vLLM's definitions and counts (`drafts` replaces `steps`; the last step counts in full), `engine`,
    # `measured_by`, `lossless`. 3 (one bump for this release): the decoding (`sampling`: greedy or a temperature,
    # truncation, drafting method, samples, seed), `units` (one record per prompt and sample), `intervals` and
    # `expected` (a number's meaning now depends on `sampling`; a /2 file is greedy), and the optional serving keys
    # `sweep`, `speedup`, `by_context` and `calibration` (docs/acceptance.md). /2 files are still read.
    "eval": "dspark-hub/eval/3",
}
#: Eval documents of earlier versions that readers still take (all greedy; no units).
EVAL_READ = ("dspark-hub/eval/1", "dspark-hub/eval/2", "dspark-hub/eval/3")

#: `checksums.json`, the digest manifest beside the weights.
CHECKSUMS = "dspark-hub/checksums-manifest/1"
#: `dspark_init.json`, how `init --target` sized a draft (taps, mask token and why, draft vocabulary).
INIT_TARGET = "dspark-hub/init-target/1"
#: `speculation_profile.json`'s own object (`dspark_hub`), beside Model-Optimizer's keys (`format.speculation_profile`).
SPECULATION_PROFILE = "dspark-hub/speculation-profile/1"
#: `manifest.json` (and shard metadata) of a rollouts folder.
ROLLOUTS_DATA = "dspark-hub/rollouts-data/1"
#: `__metadata__["schema"]` of a golden-vector fixture.
GOLDEN_FIXTURE = "dspark-hub/golden-fixture/1"

#: Ids these files carried before 0.2; still read, never written.
LEGACY_FILE_IDS: dict[str, str] = {
    "dspark-hub/checksums/1": CHECKSUMS,
    "dspark-hub/rollouts/1": ROLLOUTS_DATA,
    "dspark-hub/golden/1": GOLDEN_FIXTURE,
}


def command(name: str) -> str:
    """The schema id of a command's `--json` output.

    Raises:
        KeyError: not a command (a typo here is a bug, not a user error).
    """
    return COMMANDS[name]


def current(schema_id: object) -> object:
    """A file's schema id with a legacy id mapped to the one written today."""
    return LEGACY_FILE_IDS.get(schema_id, schema_id) if isinstance(schema_id, str) else schema_id
