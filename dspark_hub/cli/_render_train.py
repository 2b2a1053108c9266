"""Human views of the train commands' results: rollouts, target init, the plan, training, eval."""

from __future__ import annotations

from typing import Any

from dspark_hub._text import plural
from dspark_hub.cli._output import size_text
from dspark_hub.cli._table import Cell, Column, print_table
from dspark_hub.cli._terminal import TerminalText as Text
from dspark_hub.cli._terminal import stderr, stdout


def render_rollouts(summary: Any) -> None:
    """Human view of a `RolloutSummary`."""
    agreement = "-" if summary.greedy_agreement is None else f"{summary.greedy_agreement:.4f}"
    stdout.print(f"wrote {plural(summary.written, 'sequence')} ({summary.skipped} already there) to {summary.path}: "
                 f"{plural(summary.sequences, 'sequence')}, "
                 f"{plural(summary.continuation_tokens, 'supervised token')}, "
                 f"{plural(summary.shards, 'shard')}, greedy agreement {agreement} "
                 f"({summary.engine} engine, {summary.mode})")


def render_init_teacher(result: Any) -> None:
    """Human view of a `TargetInitResult`."""
    source = f"shapes and embedding of {result.draft}" if result.draft else f"profile {result.profile}"
    stdout.print(f"wrote {result.path}: a random Llama target ({source}; hidden {result.hidden_size}, "
                 f"{plural(result.num_hidden_layers, 'layer')}, vocabulary {result.vocab_size:,}, "
                 f"{plural(result.parameters, 'parameter')}) with an offline byte-level tokenizer")


def binary_size(n: float) -> str:
    """`8.1 GiB`, `512.0 KiB`, `96 bytes` (memory reads in binary units)."""
    return size_text(n, binary=True)


def _flops(n: float) -> str:
    for unit, scale in (("PFLOP", 1e15), ("TFLOP", 1e12), ("GFLOP", 1e9), ("MFLOP", 1e6)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n:,.0f} FLOP"


#: How `plan.memory_bytes` parts read.
MEMORY_PARTS = {"attention": "attention", "activations": "activations", "loss": "loss chunks",
                "states": "weights+grads+AdamW", "teacher_lm_head": "target lm_head",
                "target_embedding": "target embedding"}


def plan_lines(plan: dict[str, Any]) -> list[str]:
    """A `TrainPlan.to_dict()` as the lines `finetune` prints before step 1 (flags named, estimates marked)."""
    ranks = f" per rank ({plan['world_size']} ranks)" if plan["world_size"] > 1 else ""
    flops, total = plan["flops"], plan["total_flops"] or 1.0
    memory = plan["memory_bytes"]
    split = ", ".join(f"{part} {100 * flops[part] / total:.0f}%" for part in sorted(flops, key=flops.get, reverse=True))
    parts = ", ".join(f"{MEMORY_PARTS.get(part, part)} {binary_size(memory[part])}"
                      for part in sorted(memory, key=memory.get, reverse=True))
    if plan.get("layout") == "packed":
        shape = [
            f"finetune plan, from step 1's batch: {plural(plan['sequences'], 'sequence')} packed into one row of "
            f"{plan['positions']:,} positions ({plan['supervised_tokens']:,} supervised tokens) a step",
            f"  {plan['anchors']:,} anchors x block {plan['block_size']} = {plan['block_rows']:,} block rows, each "
            f"attending over its sequence's rows before the anchor and its block (at most {plan['keys_per_row']:,} "
            f"keys); {plan['vocabulary_rows']:,} rows x {plan['vocabulary']:,} vocabulary for the loss",
        ]
    else:
        shape = [
            f"finetune plan{ranks}, from step 1's batch: {plural(plan['sequences'], 'sequence')} x "
            f"{plan['positions']:,} positions ({plan['supervised_tokens']:,} supervised tokens) a step",
            f"  {plan['sequences']} x {plan['anchors']:,} anchors x block {plan['block_size']} = "
            f"{plan['block_rows']:,} block rows, each attending over {plan['keys_per_row']:,} keys "
            f"({plan['positions']:,} positions + {plan['anchors'] * plan['block_size']:,} block rows); "
            f"{plan['vocabulary_rows']:,} rows x {plan['vocabulary']:,} vocabulary for the loss",
        ]
    lines = [
        *shape,
        f"  the run: {plural(plan['steps'], 'step')} x {plural(plan['step_anchors'], 'anchor')}"
        + (f" x {plan['world_size']} ranks" if plan["world_size"] > 1 else "")
        + f" = ~{plan['run_anchors']:,} anchors, ~{plan['run_supervised_slots']:,} supervised block slots "
        f"(step 1: {plan['supervised_slots']:,} of {plan['step_anchors'] * plan['block_size']:,} slots)",
        f"  compute ~{_flops(total)} a step: {split}",
        f"  memory ~{binary_size(plan['memory_total_bytes'])} (estimate, besides the runtime): {parts}",
    ]
    if plan["dominant"] == "attention":
        lines.append("  attention grows with (--anchors x --block-size)^2 per sequence: halving --anchors cuts it "
                     "about 4x")
    return lines


def render_plan(plan: Any) -> None:
    """`finetune`'s plan on stderr, before step 1 (above the progress bar on a terminal)."""
    for line in plan_lines(plan.to_dict()):
        stderr.print(line, soft_wrap=True)


def render_training(result: Any) -> None:
    """Human view of a `TrainResult`."""
    loss = "-" if result.final_loss is None else f"{result.final_loss:.4f}"
    log = f"{result.path}/training_log.jsonl"
    stdout.print(f"wrote {result.path}: {plural(result.steps, 'step')}, {plural(result.anchors, 'anchor')}, "
                 f"{plural(result.supervised_slots, 'supervised block slot')}, {plural(result.tokens, 'token')}, "
                 f"{result.tokens_per_second:,.0f} tokens/s on {result.device}, final loss {loss} (log: {log})")
    if result.plan is not None:
        measured = "CUDA allocated" if result.device.startswith("cuda") else "process RSS"
        stdout.print(f"memory: estimated ~{binary_size(result.plan.memory_bytes)} for training plus the runtime, "
                     f"measured peak "
                     f"{binary_size(result.peak_memory_bytes)} ({measured})")
    if result.states:
        stdout.print(f"states in {result.state_dir}: {', '.join(result.states)}")
    for action in result.engine_releases:
        stdout.print(f"between rounds: {action}")
    for warning in result.warnings:
        stderr.print(Text.assemble(("warning", "yellow"), f": {warning}"))
    if result.eval:
        stdout.print(f"held-out acceptance length {result.eval['acceptance_length']:.4f} "
                     f"(prompt lookup {result.eval['baseline']['acceptance_length']:.4f})")


def render_eval(result: Any) -> None:
    """Acceptance table (draft, reference, prompt lookup; overall and per dataset), then the counts; a sampled
    eval also shows the 95% interval and the expected acceptance length."""
    data = result.to_dict()
    block = len(data["per_position"])
    sampled = data["sampling"]["temperature"] > 0
    columns = [Column("data"), Column("drafter"), Column("AL", label=True, justify="right"),
               *([Column("expected AL", label=True, justify="right")] if sampled else []),
               *[Column(f"a{k}", label=True, justify="right") for k in range(1, block + 1)],
               Column("drafts", label=True, justify="right")]
    rows: list[list[Cell]] = []

    def row(scope: str, name: str, stats: dict[str, Any], expected: float | None = None) -> None:
        rows.append([scope, name, f"{stats['acceptance_length']:.4f}",
                     *([f"{expected:.4f}" if expected is not None else "-"] if sampled else []),
                     *[f"{a:.3f}" for a in stats["per_position"]], f"{stats['drafts']:,}"])

    overall_expected = data["expected"]["acceptance_length"] if data["expected"] else None
    for scope, stats in [("all", data), *data["by_dataset"].items()]:
        row(scope, "draft", stats, overall_expected if scope == "all" else None)
        if stats.get("reference") or (scope == "all" and data["reference"]):
            row(scope, "reference", stats.get("reference") or data["reference"])
        if stats.get("baseline"):
            row(scope, "prompt lookup", stats["baseline"], stats["baseline"].get("expected_acceptance_length"))
    harness, measured = data["harness"], data["measured_by"]
    decoding = data["sampling"]["describe"]
    title = (f"measured by vLLM {measured['vllm_version']} ({decoding})" if measured
             else f"simulated acceptance (vLLM's verify loop, {decoding})")
    print_table(title, columns, rows)
    stdout.print(f"accepted per position {data['accepted_per_position']} of {plural(data['drafts'], 'draft')} "
                 f"(k {data['k']}); {plural(data['prompts'], 'prompt')}, {plural(data['tokens'], 'output token')}; "
                 f"target {harness['teacher']}")
    for line in interval_lines(data):
        stdout.print(line)
    if measured:
        spec = measured["speculative_config"]
        stdout.print(f"vLLM {measured['vllm_version']}, {measured['model_runner']} runner"
                     f"{', Triton interpreter' if measured['triton_interpret'] else ''}, {measured['dtype']}; "
                     f"speculative config {spec}")
        if data["lossless"] is not None:
            stdout.print("lossless: the outputs equal plain greedy decoding's" if data["lossless"] else
                         "NOT lossless: the outputs differ from plain greedy decoding's")
    if data["reference"]:
        stdout.print(f"ratio to reference: {data['reference']['ratio']:.4f}")
    if data["plot"]:
        stdout.print(f"wrote {data['plot']}")
    stdout.print(f"definition: {data['definition']}")
    render_serving(data)


def interval_lines(data: dict[str, Any]) -> list[str]:
    """A sampled eval's 95% intervals (counts, and the expected numbers: labelled) and the samples for +-0.02."""
    intervals, expected = data["intervals"], data["expected"]
    if data["sampling"]["temperature"] == 0 or intervals is None:
        return []
    units = f"{plural(intervals['prompts'], 'prompt')} x {data['sampling']['samples']} samples"
    lines = [f"AL {intervals['acceptance_length']['estimate']:.4f}, 95% interval "
             f"[{intervals['acceptance_length']['low']:.4f}, {intervals['acceptance_length']['high']:.4f}] over "
             f"{units} (+-{intervals['half_width']:.4f})"]
    if expected is not None and expected["intervals"] is not None:
        band = expected["intervals"]
        lines.append(f"expected AL {expected['acceptance_length']:.4f}, 95% interval "
                     f"[{band['acceptance_length']['low']:.4f}, {band['acceptance_length']['high']:.4f}] "
                     f"(+-{band['half_width']:.4f}): {expected['label']}")
    needed = intervals.get("samples_for_half_width_0.02")
    if intervals["units"] > intervals["prompts"]:
        lines.append(f"samples a prompt for AL +-0.02 on these prompts: {needed}" if needed is not None else
                     "AL +-0.02 needs more prompts: the spread between these prompts alone is wider")
    return lines


def render_compare(result: Any) -> None:
    """B - A: acceptance length and each position with their paired 95% intervals, datasets, the prompts that
    moved most, and the gate's verdict."""
    data = result.to_dict()
    columns = [Column("number"), Column("A", label=True, justify="right"), Column("B", label=True, justify="right"),
               Column("B - A", label=True, justify="right"), Column("95% interval", label=True, justify="right")]

    def cells(name: str, change: dict[str, Any], digits: int = 4) -> list[Cell]:
        d = change["difference"]
        return [name, f"{change['a']:.{digits}f}", f"{change['b']:.{digits}f}", f"{d['estimate']:+.{digits}f}",
                f"[{d['low']:+.{digits}f}, {d['high']:+.{digits}f}]"]

    rows = [cells(f"AL ({data['gated_on']})", data["acceptance_length"]),
            *[cells(f"a{i}", change, 3) for i, change in enumerate(data["per_position"], 1)]]
    if data["gated_on"] != "counts":
        rows.append(cells("AL (counts)", data["counts"]))
    rows += [cells(f"AL {name}", entry) for name, entry in data["by_dataset"].items()]
    print_table(f"B - A, paired over {plural(data['prompts'], 'prompt')} ({data['decoding']}, k={data['k']})",
                columns, rows)
    stdout.print(f"A: {data['a']}")
    stdout.print(f"B: {data['b']}")
    for mover in data["movers"]:
        where = f" ({mover['dataset']})" if mover["dataset"] else ""
        stdout.print(f"moved: prompt {mover['prompt_index']}{where} AL {mover['a']:.3f} -> {mover['b']:.3f} "
                     f"({mover['difference']:+.3f})")
    high = data["acceptance_length"]["difference"]["high"]
    if data["fail_if_worse"] is not None:
        stdout.print(f"worse by more than {data['fail_if_worse']} with 95% confidence: B - A <= {high:+.4f}" if
                     data["worse"] else f"not worse by more than {data['fail_if_worse']} with 95% confidence "
                     f"(the interval reaches {high:+.4f})")
    stdout.print(f"interval: {data['method']}")


def _rate_cells(rates: list[float], width: int) -> list[Cell]:
    return [f"{rates[i]:.3f}" if i < len(rates) else "" for i in range(width)]


def render_serving(data: dict[str, Any]) -> None:
    """`eval`'s serving answers, each when asked: the k sweep with the expected speedup, acceptance by context
    length, the confidence head's calibration, the profile written."""
    if data.get("sweep"):
        _render_sweep(data["sweep"], data.get("speedup"))
    elif data.get("speedup"):
        _render_sweep({"by_k": {str(data["k"]): data}}, data["speedup"])
    if data.get("by_context"):
        section = data["by_context"]
        width = section["k"]
        print_table(f"acceptance by context length at the anchor (k {width})",
                    [Column("data"), Column("context"), Column("drafts", label=True, justify="right"),
                     Column("AL", label=True, justify="right"),
                     *[Column(f"a{i}", label=True, justify="right") for i in range(1, width + 1)]],
                    [[r["dataset"], r["context"], f"{r['drafts']:,}", f"{r['acceptance_length']:.4f}",
                      *_rate_cells(r["per_position"], width)] for r in section["rows"]])
    if data.get("calibration"):
        section = data["calibration"]
        print_table(f"confidence head: estimated prefix survival against acceptance (k {section['k']})",
                    [Column("position", justify="right"), Column("drafts", label=True, justify="right"),
                     Column("estimated", label=True, justify="right"), Column("observed", label=True, justify="right"),
                     Column("ECE", label=True, justify="right")],
                    [[str(r["position"]), f"{r['drafts']:,}", f"{r['estimated']:.3f}", f"{r['observed']:.3f}",
                      f"{r['ece']:.3f}"] for r in section["positions"]])
        verdict = "calibrated" if section["calibrated"] else "not calibrated"
        stdout.print(f"expected calibration error {section['ece']:.3f} over all positions: {verdict} "
                     f"(at most {section['calibrated_below']})")
    if data.get("profile"):
        stdout.print(f"wrote {data['profile']}")


def _render_sweep(sweep: dict[str, Any], speedup: dict[str, Any] | None) -> None:
    width = max(len(row["per_position"]) for row in sweep["by_k"].values())
    gains = speedup["by_k"] if speedup else {}
    columns = [Column("k", justify="right"), Column("AL", label=True, justify="right"),
               Column("drafts", label=True, justify="right"),
               *[Column(f"a{i}", label=True, justify="right") for i in range(1, width + 1)]]
    if gains:
        columns += [Column("draft cost", label=True, justify="right"), Column("verify cost", label=True,
                                                                              justify="right"),
                    Column("speedup", label=True, justify="right")]
    rows: list[list[Cell]] = []
    for k, row in sweep["by_k"].items():
        cells: list[Cell] = [k, f"{row['acceptance_length']:.4f}", f"{row['drafts']:,}",
                             *_rate_cells(row["per_position"], width)]
        if k in gains:
            best = "*" if int(k) == speedup["best_k"] else ""   # type: ignore[index]  # gains implies speedup
            cells += [f"{gains[k]['draft_cost']:.3f}", f"{gains[k]['verify_cost']:.3f}",
                      f"{gains[k]['expected_speedup']:.3f}{best}"]
        elif gains:
            cells += ["", "", ""]
        rows.append(cells)
    print_table("acceptance per k (simulated, the same rollouts)", columns, rows)
    if speedup:
        stdout.print(f"{speedup['label']}; best k {speedup['best_k']} (*)")


def render_probe(result: Any) -> None:
    """One row per convention: declared value, verdict, the value the weights follow, the paired statistic; then the
    untrained level, per-position acceptance and each contradiction's fix."""
    data = result.to_dict()
    columns = [Column("convention"), Column("declared"), Column("verdict", label=True), Column("weights follow"),
               Column("paired difference (expected accepted / anchor)", justify="right")]
    rows: list[list[Cell]] = []
    for convention in data["conventions"]:
        compared = [c for c in convention["candidates"] if c["z"] is not None or c["difference"] is not None]
        named = next((c for c in compared if c["value"] == convention["follows"]), None)
        shown = named or (max(compared, key=lambda c: c["z"] if c["z"] is not None else -1e9) if compared else None)
        stat = "" if shown is None else (f"{shown['value'].split(':')[0]}: {shown['difference']:+.5f} "
                                         f"± {shown['standard_error']:.5f}")
        rows.append([convention["title"], convention["declared"], convention["verdict"],
                     convention["follows"] or "-", stat])
    print_table(f"probe of {data['draft']} ({data['format']}, k {data['k']})", columns, rows)
    level = data["untrained"]
    stdout.print(f"untrained level {level['level']:.5f} expected accepted per anchor; best reading "
                 f"{level['best_expected_accepted']:.5f} ({level['best']}, z {level['z'] or 0:+.1f}): "
                 + ("above it" if level["above"] else "AT the untrained level, so every convention is 'cannot tell'"))
    stdout.print("acceptance by position (draft / untrained): "
                 + " ".join(f"{a:.4f}/{b:.4f}" for a, b in zip(data["per_position"]["draft"],
                                                               data["per_position"]["untrained"], strict=True)))
    stdout.print(f"{plural(data['anchors'], 'anchor')} of {plural(data['paths'], 'greedy path')} ({data['data']}); "
                 f"named at {data['decision']['z']:g} standard errors; {data['seconds']:.0f} s")
    for convention in data["conventions"]:
        if convention["verdict"] == "other":
            stdout.print(f"fix {convention['key']}: {convention['fix']}")
        elif convention["verdict"] == "cannot tell":
            stdout.print(f"cannot tell {convention['key']}: {convention['reason']}")


def render_threads(choice: Any) -> None:
    """The CPU threads a training command uses, and why (stderr)."""
    stderr.print(f"threads: {choice.threads} ({choice.reason}; --threads N to choose)")
