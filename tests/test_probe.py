"""The behaviour probe's decision rule, its measure, and the probe on the speculators library's trained fixture
(docs/probe.md).

The rule is tested on per-anchor values shaped like real ones (heavy-tailed: most anchors near zero, a few near
one), where the paired statistic and a comparison of raw means disagree. Two twins of the rule must fail the same
cases: one that always answers "as declared", one that names whichever candidate has the highest mean.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
import torch

from dspark_hub.train.evaluation import probe as probe_module
from dspark_hub.train.evaluation import probe_gate
from dspark_hub.train.evaluation.expected import Paired, Reading, expected_accepted, paired
from dspark_hub.train.evaluation.probe import Candidate, Convention, decide

SPECDEC = Path(__file__).parent / "fixtures" / "specdec"

pytestmark = pytest.mark.usefixtures("one_torch_thread")


# ----------------------------------------------------------------------------- the paired statistic


def test_paired_is_the_mean_difference_with_run_means_as_units():
    a = [torch.zeros(32, dtype=torch.float64)]
    b = [torch.cat([torch.full((16,), 0.1), torch.full((16,), 0.3)]).double()]
    p = paired(a, b, run=16)
    assert p.units == 2 and p.mean == pytest.approx(0.2)
    # two units with means 0.1 and 0.3: standard error of their mean = 0.1
    assert p.standard_error == pytest.approx(0.1)
    assert p.z == pytest.approx(2.0)


def test_paired_counts_correlated_neighbours_as_one_unit():
    """Anchor-by-anchor units would call a difference carried by one run of anchors significant."""
    diff = torch.zeros(160, dtype=torch.float64)
    diff[:16] = 0.05                              # one stretch of one path moves, the rest does not
    per_anchor = paired([torch.zeros(160)], [diff], run=1)
    by_runs = paired([torch.zeros(160)], [diff], run=16)
    assert per_anchor.z > 3 > by_runs.z


def test_identical_values_are_identical_not_a_division_by_zero():
    same = [torch.rand(40, generator=torch.Generator().manual_seed(0)).double()]
    p = paired(same, same)
    assert p.identical and p.z == 0.0
    assert Paired(0.5, 0.0, 3).z == math.inf


def test_expected_accepted_sums_the_products_of_the_slots():
    q = torch.tensor([[0.5, 0.5, 1.0], [1.0, 0.0, 1.0]])
    assert expected_accepted(q).tolist() == [0.5 + 0.25 + 0.25, 1.0]


# ----------------------------------------------------------------------------- the decision rule


def heavy_tailed(n: int, seed: int, *, scale: float = 1.0) -> torch.Tensor:
    """Per-anchor values like a young draft's: mostly ~0.001, one anchor in twenty near 0.5."""
    g = torch.Generator().manual_seed(seed)
    hits = (torch.rand(n, generator=g) < 0.05).double()
    return (0.001 * torch.rand(n, generator=g) + hits * 0.5 * torch.rand(n, generator=g)).double() * scale


def noisy_copy(values: torch.Tensor, seed: int, *, spread: float) -> torch.Tensor:
    """`values` with every anchor moved at random (a reading that changes the draft's function, not its skill)."""
    g = torch.Generator().manual_seed(seed)
    return (values * (1 + spread * torch.randn(len(values), generator=g, dtype=torch.float64))).clamp(min=0)


READING = Reading((1, 2), 4, 4)


def convention(n: int) -> Convention:
    candidates = tuple(Candidate(f"alt{i}", Reading((1, 2 + i), 4, 4), fix=f"set x to alt{i}") for i in range(n))
    return Convention("taps", "taps", Candidate("declared", READING), candidates)


def case(name: str) -> tuple[Convention, dict[Candidate, list[torch.Tensor]], str, str | None]:
    """(convention, per-candidate per-path values, the true verdict, the value named)."""
    conv = convention(2)
    base = [heavy_tailed(200, seed) for seed in range(8)]
    declared, alt0, alt1 = conv.declared, *conv.candidates
    if name == "declared clearly best":
        values = {declared: base, alt0: [v * 0.6 for v in base], alt1: [v * 0.7 for v in base]}
        return conv, values, "as declared", "declared"
    if name == "a candidate clearly best":
        values = {declared: [v * 0.5 for v in base], alt0: base, alt1: [v * 0.4 for v in base]}
        return conv, values, "other", "alt0"
    if name == "a candidate higher by noise":
        # alt0's mean is the highest, by 3%, but its per-anchor changes go both ways: nothing separates
        values = {declared: base, alt0: [noisy_copy(v, s, spread=0.3) * 1.03 for s, v in enumerate(base)],
                  alt1: [v * 0.5 for v in base]}
        return conv, values, "cannot tell", None
    if name == "two candidates tie above the declared value":
        values = {declared: [v * 0.5 for v in base], alt0: base,
                  alt1: [noisy_copy(v, s, spread=0.05) for s, v in enumerate(base)]}
        return conv, values, "cannot tell", None
    if name == "a candidate better by a hair at every anchor":
        # significant (the same 0.2% at every anchor) but immaterial: what perturbing a weak draft's inputs does
        values = {declared: base, alt0: [v * 1.002 for v in base], alt1: [v * 0.5 for v in base]}
        return conv, values, "cannot tell", None
    raise AssertionError(name)


CASES = ["declared clearly best", "a candidate clearly best", "a candidate higher by noise",
         "two candidates tie above the declared value", "a candidate better by a hair at every anchor"]


def always_declared(conv: Convention, values: dict) -> tuple[str, str | None]:
    """The twin that trusts the config."""
    return "as declared", conv.declared.value


def highest_mean(conv: Convention, values: dict) -> tuple[str, str | None]:
    """The twin that names the candidate with the highest raw mean, without the paired statistic."""
    def mean(c: Candidate) -> float:
        return float(torch.cat(values[c]).mean())
    best = max((conv.declared, *conv.candidates), key=mean)
    return ("as declared", best.value) if best is conv.declared else ("other", best.value)


def the_probe(conv: Convention, values: dict) -> tuple[str, str | None]:
    verdict = decide(conv, values)
    return verdict.verdict, (conv.declared.value if verdict.verdict == "as declared" else verdict.follows)


def wrong_cases(decider) -> list[str]:
    """The cases a decision rule gets wrong (verdict or named value)."""
    wrong = []
    for name in CASES:
        conv, values, verdict, named = case(name)
        if decider(conv, values) != (verdict, named):
            wrong.append(name)
    return wrong


def test_the_rule_gets_every_case_right():
    assert wrong_cases(the_probe) == []


@pytest.mark.parametrize("twin, fails_on", [
    (always_declared, {"a candidate clearly best", "a candidate higher by noise",
                       "two candidates tie above the declared value", "a candidate better by a hair at every anchor"}),
    (highest_mean, {"a candidate higher by noise", "two candidates tie above the declared value",
                    "a candidate better by a hair at every anchor"}),
])
def test_the_twins_fail(twin, fails_on):
    """A probe that trusts the config, and one that compares raw means, each get cases wrong the rule gets right."""
    assert set(wrong_cases(twin)) == fails_on


def test_the_hair_is_significant_but_below_the_floor():
    """The case above is a real difference by the standard errors: only the materiality floor keeps it unnamed."""
    conv, values, _, _ = case("a candidate better by a hair at every anchor")
    named = decide(conv, values)
    hair = next(s for s in named.scores if s.value == "alt0")
    assert hair.paired is not None and hair.paired.z > probe_module.Z
    assert hair.paired.mean < probe_module.MATERIAL * float(torch.cat(values[conv.declared]).mean())


def test_a_named_value_carries_its_fix_and_statistic():
    conv, values, _, _ = case("a candidate clearly best")
    verdict = decide(conv, values)
    assert verdict.verdict == "other" and verdict.follows == "alt0" and verdict.fix == "set x to alt0"
    named = next(s for s in verdict.scores if s.value == "alt0")
    assert named.paired is not None and named.paired.z > probe_module.Z and named.paired.mean > 0
    assert "z +" in verdict.reason


def test_an_inert_head_is_named_exactly():
    """A Markov head whose bias is zero gives the declared probabilities at every anchor: "without", no statistics."""
    without = Candidate("without", Reading((1,), 4, 4, markov=False), fix="export the head")
    conv = Convention("markov", "Markov head", Candidate("with", READING), (without,), inert=without)
    base = [heavy_tailed(100, seed) for seed in range(4)]
    assert decide(conv, {conv.declared: base, without: base}).follows == "without"
    # the twin: the same values under a convention with no inert value say nothing
    plain = Convention("markov", "Markov head", Candidate("with", READING), (without,))
    assert decide(plain, {plain.declared: base, without: base}).verdict == "cannot tell"


def test_the_untrained_level_needs_both_the_ratio_and_the_standard_errors():
    untrained = [heavy_tailed(200, seed, scale=0.2) for seed in range(8)]
    trained = {"declared": [v * 5 for v in untrained]}
    assert probe_module.untrained_level(trained, untrained).trained
    # 50% above the untrained level at every anchor: significant, but not twice the level
    assert not probe_module.untrained_level({"declared": [v * 1.5 for v in untrained]}, untrained).trained
    # twice the level on average, but from a handful of anchors: not significant
    lucky = [v.clone() for v in untrained]
    lucky[0][0] += float(torch.cat(untrained).sum())
    assert not probe_module.untrained_level({"declared": lucky}, untrained).trained


# ----------------------------------------------------------------------------- the speculators library's fixture


def specdec_copy(tmp_path: Path, change=None) -> Path:
    folder = tmp_path / "draft"
    shutil.copytree(SPECDEC / "dspark", folder)
    if change:
        config = json.loads((folder / "config.json").read_text())
        change(config)
        (folder / "config.json").write_text(json.dumps(config, indent=2))
    return folder


def write_mutant(tmp_path: Path, name: str, *, config=None, tensors=None) -> Path:
    """A copy of the library's trained draft with its config or some tensors changed (safetensors, not our writer)."""
    from safetensors.torch import load_file, save_file

    folder = tmp_path / name
    shutil.copytree(SPECDEC / "dspark", folder)
    if config is not None:
        data = json.loads((folder / "config.json").read_text())
        config(data)
        (folder / "config.json").write_text(json.dumps(data, indent=2))
    if tensors is not None:
        weights = load_file(str(folder / "model.safetensors"))
        tensors(weights)
        save_file(weights, str(folder / "model.safetensors"), metadata={"format": "pt"})
    return folder


def untrained(weights: dict) -> None:
    """What `init` writes: norms ones, matrices N(0, 0.02), seeded."""
    generator = torch.Generator().manual_seed(1)
    for name in sorted(weights):
        if name.endswith("norm.weight"):
            weights[name] = torch.ones_like(weights[name])
        elif weights[name].is_floating_point():
            weights[name] = (0.02 * torch.randn(weights[name].shape, generator=generator)).to(weights[name].dtype)


#: The speculators library's trained DSpark (tests/fixtures/specdec: 200 library steps on a random Qwen3 target,
#: AL 1.29 measured by vLLM on these prompts) and mistakes made to it as a user would, with what the probe must say.
#: Conventions left out of a row are "cannot tell" on this draft: it barely reads its context (taps one layer
#: off: z -1.7), and its slot 1 does not depend on the block's length (k = 2, 3: z -1.3, -1.6).
WITH_HEAD = ("as declared", "with: the body relies on it")
SPECDEC_MATRIX = {
    "trained": ({}, {"slot_layout": ("as declared", "true"), "markov": WITH_HEAD}),
    "slot layout flipped": ({"config": lambda c: c.update(sample_from_anchor=False)},
                            {"slot_layout": ("other", "true"), "markov": WITH_HEAD}),
    "Markov output zeroed": ({"tensors": lambda w: w["markov_head.markov_w2.weight"].zero_()},
                             {"slot_layout": ("as declared", "true"), "markov": ("other", "without: the body alone")}),
    "untrained": ({"tensors": untrained}, {}),
}
#: Anchors per prompt: 8 prompts x 192 (the library trained on 64-token continuations of 16-token prompts).
SPECDEC_TOKENS = 192


@pytest.fixture(scope="module")
def specdec_probes(tmp_path_factory):
    from dspark_hub.train.evaluation.probe import probe

    work = tmp_path_factory.mktemp("specdec")
    return {name: probe(write_mutant(work, name.replace(" ", "-"), **change), target=SPECDEC / "target",
                        prompts=SPECDEC / "prompts.jsonl", max_new_tokens=SPECDEC_TOKENS)
            for name, (change, _) in SPECDEC_MATRIX.items()}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(SPECDEC_MATRIX))
def test_the_probe_names_the_library_drafts_conventions(specdec_probes, name):
    result = specdec_probes[name]
    expected = SPECDEC_MATRIX[name][1]
    said = {c.key: (c.verdict, c.follows if c.verdict != "cannot tell" else None) for c in result.conventions}
    assert set(said) == {"taps", "slot_layout", "markov", "block"}     # no pruned vocabulary, no final-layer tap
    for key, verdict in said.items():
        assert verdict == expected.get(key, ("cannot tell", None)), (key, said)
    assert result.untrained.trained == (name != "untrained")
    assert result.ok == (name in ("trained", "untrained"))


@pytest.mark.slow
def test_an_untrained_draft_gets_cannot_tell_even_where_readings_differ(specdec_probes):
    """Its flipped slot layout scores lower by many standard errors: a difference between two random functions,
    which the untrained level keeps from becoming a verdict."""
    result = specdec_probes["untrained"]
    layout = next(c for c in result.conventions if c.key == "slot_layout")
    assert layout.verdict == "cannot tell" and "untrained level" in layout.reason
    assert abs(next(s.paired.z for s in layout.scores if s.paired is not None)) > probe_module.Z


# ----------------------------------------------------------------------------- the gate and the card


@pytest.mark.slow
def test_the_gate_turns_a_contradiction_into_an_error_with_its_fix(specdec_probes):
    """`verify --probe`'s findings: an error per contradicted convention, with the key to set; notes otherwise."""
    flipped = probe_gate.findings(specdec_probes["slot layout flipped"])
    assert [(f.code, f.hint) for f in flipped if f.severity == "error"] == [
        ("PROBE_SLOT_LAYOUT", "set sample_from_anchor to true")]
    assert {f.severity for f in probe_gate.findings(specdec_probes["trained"])} == {"info"}
    assert {f.code for f in probe_gate.findings(specdec_probes["untrained"])} == {probe_module.UNDETERMINED}


def _probe_args(*extra: str) -> list[str]:
    return ["--target", str(SPECDEC / "target"), "--probe-prompts", str(SPECDEC / "prompts.jsonl"), *extra]


@pytest.mark.slow
def test_verify_probe_fails_an_inert_markov_head_and_passes_the_trained_draft(tmp_path):
    """The zeroed head is named exactly (no statistics), so the default 48 anchors a prompt decide it."""
    from click.testing import CliRunner

    from dspark_hub.cli.main import cli

    zeroed = write_mutant(tmp_path, "zeroed", tensors=lambda w: w["markov_head.markov_w2.weight"].zero_())
    bad = CliRunner().invoke(cli, ["verify", str(zeroed), "--probe", *_probe_args("--json")])
    assert bad.exit_code == 1, bad.output
    doc = json.loads(bad.stdout)
    errors = [f for f in doc["findings"] if f["severity"] == "error"]
    assert [f["code"] for f in errors] == ["PROBE_MARKOV"] and "export the trained Markov head" in errors[0]["hint"]
    assert doc["sections"]["probe"]["schema"] == "dspark-hub/probe/1" and not doc["sections"]["probe"]["ok"]
    trained = write_mutant(tmp_path, "trained")
    good = CliRunner().invoke(cli, ["verify", str(trained), "--probe", *_probe_args("--json")])
    assert good.exit_code == 0, good.output
    assert json.loads(good.stdout)["sections"]["probe"]["ok"]


def test_verify_probe_needs_a_target_and_probe_prompts_needs_probe(tmp_path):
    from click.testing import CliRunner

    from dspark_hub.cli.main import cli

    draft = str(SPECDEC / "dspark")
    for args in (["verify", draft, "--probe"], ["verify", draft, *_probe_args()],
                 ["publish", draft, "org/name", "--probe-prompts", str(SPECDEC / "prompts.jsonl"), "--dry-run"]):
        result = CliRunner().invoke(cli, args)
        assert result.exit_code == 2 and "probe" in result.output and "Traceback" not in result.output, args


@pytest.mark.slow
def test_publish_probe_refuses_a_contradicted_draft_before_anything_is_sent(tmp_path):
    """The twin is the same folder without --probe: refused only for its missing card, never for the probe."""
    from click.testing import CliRunner

    from dspark_hub.cli.main import cli

    zeroed = write_mutant(tmp_path, "zeroed", tensors=lambda w: w["markov_head.markov_w2.weight"].zero_())
    probed = CliRunner().invoke(cli, ["publish", str(zeroed), "org/name", "--dry-run", "--json", "--probe",
                                      str(SPECDEC / "target"), "--probe-prompts", str(SPECDEC / "prompts.jsonl")])
    plain = CliRunner().invoke(cli, ["publish", str(zeroed), "org/name", "--dry-run", "--json"])
    refusals = json.loads(probed.stdout)["gate"]["refusals"]
    assert probed.exit_code == 1 and any("probe: Markov head" in r for r in refusals), refusals
    plain_refusals = json.loads(plain.stdout)["gate"]["refusals"]
    assert plain_refusals and not any("probe:" in r for r in plain_refusals)


@pytest.mark.slow
def test_the_card_records_the_conventions_checked_by_behaviour(tmp_path, specdec_probes):
    import yaml

    from dspark_hub.cards.render import render_card
    from dspark_hub.errors import UsageError

    meta = tmp_path / "card.yaml"
    meta.write_text(yaml.safe_dump({"name": "Tiny-Draft", "front_matter": {
        "license": "apache-2.0", "base_model": "org/target", "base_model_relation": "finetune", "tags": ["dspark"],
        "pipeline_tag": "text-generation"}}, sort_keys=False))
    probed = tmp_path / "probe.json"
    probed.write_text(json.dumps(specdec_probes["slot layout flipped"].to_dict()))
    text = render_card(meta, SPECDEC / "dspark", probe_json=probed)
    assert "### Conventions checked by behaviour" in text
    layout = next(line for line in text.splitlines() if line.startswith("| slot layout"))
    assert "| false | true | true: +0.0" in layout                   # declared, followed, the paired difference
    assert str(tmp_path) not in text and str(SPECDEC) not in text     # the target by identity, never its path
    assert "Conventions checked by behaviour" not in render_card(meta, SPECDEC / "dspark")
    (tmp_path / "eval.json").write_text(json.dumps({"schema": "dspark-hub/eval/2"}))
    with pytest.raises(UsageError, match="not a probe document"):
        render_card(meta, SPECDEC / "dspark", probe_json=tmp_path / "eval.json")


@pytest.mark.slow
def test_the_target_runs_once_for_every_reading(monkeypatch):
    """One engine, opened once, on the union of the layers every reading taps (taps, one earlier, one later)."""
    from dspark_hub.train.evaluation import greedy_paths as paths_module

    opened = []
    real = paths_module.open_engine
    monkeypatch.setattr(paths_module, "open_engine", lambda *args, **kwargs: opened.append(args[2]) or
                        real(*args, **kwargs))
    result = probe_module.probe(SPECDEC / "dspark", target=SPECDEC / "target", prompts=SPECDEC / "prompts.jsonl",
                                max_new_tokens=8)
    readings = sum(len(c.scores) for c in result.conventions)
    assert len(opened) == 1 and readings >= 6, (opened, readings)
    taps = json.loads((SPECDEC / "dspark" / "config.json").read_text())["aux_hidden_state_layer_ids"]
    native = [t - 1 for t in taps]                                    # speculators ids name the residual after t
    assert set(opened[0]) == {t + s for t in native for s in (-1, 0, 1) if 0 <= t + s < 6}
