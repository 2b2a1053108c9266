"""The probe in the gate: `verify --probe` (and a publish gate that asks for it) turns a contradicted convention into
an error with its code and the fix, an undetermined one into a note (`probe.ProbeResult`, docs/probe.md)."""

from __future__ import annotations

import os
from pathlib import Path

from dspark_hub.errors import UsageError
from dspark_hub.format.contract import CONFIG_NAME
from dspark_hub.progress import Progress
from dspark_hub.report import Finding, Report, error, info
from dspark_hub.train.evaluation.probe import CODES, CONFIRMED, UNDETERMINED, ProbeResult, probe


def findings(result: ProbeResult) -> list[Finding]:
    """`verify --probe`: a contradiction is an error with its convention's code and the fix; a convention the
    probe cannot tell is a note; a confirmed one is a note with its numbers."""
    out = []
    where = f"{result.draft}/{CONFIG_NAME}"
    for c in result.conventions:
        if c.verdict == "other":
            out.append(error(CODES[c.key], where, f"probe: {c.title}: the weights follow {c.follows}, the config "
                                                  f"declares {c.declared} ({c.reason})", c.fix))
        elif c.verdict == "cannot tell":
            out.append(info(UNDETERMINED, where, f"probe: {c.title}: cannot tell ({c.reason})"))
        else:
            out.append(info(CONFIRMED, where, f"probe: {c.title}: {c.declared}, as declared ({c.reason})"))
    return out


def add_to_report(report: Report, draft: str | os.PathLike[str], *, target: str | os.PathLike[str] | None,
                  block_size: int | None = None, prompts: str | os.PathLike[str] | None = None,
                  progress: Progress | None = None) -> ProbeResult:
    """`verify --probe` (and a publish gate that asks for it): probe the draft (on `prompts`, default
    `DEFAULT_PROMPTS`), add its findings and its numbers (`sections["probe"]`) to the verify report.

    Raises:
        UsageError: no target, or a draft or target that is not a local folder (the probe reads the weights and
            runs the target).
    """
    if target is None:
        raise UsageError("the probe runs the draft on the target's greedy paths: pass `target`", param="probe")
    for path, what in ((draft, "draft"), (target, "target")):
        if str(path).startswith("hf://") or not Path(path).is_dir():
            raise UsageError(f"{path}: the probe needs the {what} as a local folder (it reads every weight and runs "
                             "the target); download it first", param="probe")
    result = probe(draft, target=target, block_size=block_size, prompts=prompts, progress=progress)
    report.findings.extend(findings(result))
    report.sections["probe"] = result.to_dict()
    return result
