"""The behaviour probe's matrix on the real recipe's CI-sized drafts (docs/probe.md, docs/real-model.md).

Each row is a draft a user could hand a runtime (`bench/_probe_matrix.py`): the trained draft, a mistake of
docs/convention-mistakes.md made to it as a user would (the config or one tensor changed, the rest bit for bit),
or the untrained base. All rows of both formats are judged on one set of the target's greedy paths of the probe's
default prompts (the target runs once: the drafts tap the same layers, and each row's anchors are the positions its
longest block fits behind), as `bench/real_probe_matrix.py` does for one format. Each row must never name a wrong
value, must name the values `NAMED` lists, and the untrained base must be "cannot tell" everywhere; a probe that
trusts the config fails the mutants (the twin below).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from tests.real_drafts import FOLDERS, ROOT, TARGET, WORLD_READY

sys.path.insert(0, str(ROOT / "bench"))

from _probe_matrix import CONVENTIONS, Row, matches, mutants, verdict_of

needs_world = pytest.mark.skipif(not WORLD_READY, reason="the SmolLM2 world is not cached; build it: "
                                 ".ci/real-target.sh")
pytestmark = [pytest.mark.real, pytest.mark.slow, needs_world, pytest.mark.usefixtures("one_torch_thread")]

#: The rows CI judges (the served-k rows and the shifted taps cost a judgement each and are "cannot tell" on drafts
#: trained this little: bench/real_probe_matrix.py runs them all).
ROWS = {"speculators": ("trained", "slot layout flipped", "d2t written as absolute ids", "Markov output zeroed",
                        "untrained base"),
        "k3_dspark": ("trained", "untrained base")}
#: What the probe must name on the CI-sized drafts (measured: docs/real-model.md's probe table).
NAMED = {("speculators", "trained"): {"slot_layout": "as declared", "d2t": "as declared", "markov": "as declared"},
         ("speculators", "slot layout flipped"): {"slot_layout": "true"},
         ("speculators", "d2t written as absolute ids"): {"d2t": "absolute ids"},
         ("speculators", "Markov output zeroed"): {"markov": "without"}}


@pytest.fixture(scope="module")
def matrix(real_drafts, tmp_path_factory) -> dict[tuple[str, str], tuple[Row, Any]]:
    from _mistakes import target_layers

    from dspark_hub.train.evaluation.greedy_paths import greedy_paths
    from dspark_hub.train.evaluation.probe import DEFAULT_NEW_TOKENS, DEFAULT_PROMPTS, judge, plan_probe
    from dspark_hub.train.target.target import Target

    target = Target.open(TARGET)
    rows = {}
    for fmt, wanted in ROWS.items():
        trained = real_drafts[fmt].draft
        base = Path(trained).parent / FOLDERS[fmt][0]
        rows.update({(fmt, row.name): row for row in mutants(trained, base, tmp_path_factory.mktemp(fmt),
                                                             target_layers(TARGET)) if row.name in wanted})
    plans = {key: plan_probe(row.draft, target, block_size=row.block_size) for key, row in rows.items()}
    paths = greedy_paths(target, set().union(*(p.layers for p in plans.values())), prompts=DEFAULT_PROMPTS,
                         max_new_tokens=DEFAULT_NEW_TOKENS + max(p.longest for p in plans.values()))
    return {key: (row, judge(plans[key], paths)) for key, row in rows.items()}


def test_every_row_gets_no_wrong_value_and_the_named_ones(matrix):
    assert set(matrix) == {(fmt, name) for fmt, names in ROWS.items() for name in names}
    for key, (row, result) in matrix.items():
        said = {c: verdict_of(result, c) for c in CONVENTIONS}
        assert all(matches(row.truth, result, c) for c in CONVENTIONS), (key, said)
        for convention, value in NAMED.get(key, {}).items():
            assert said[convention] == value, (key, said)


def test_the_untrained_bases_are_cannot_tell_everywhere(matrix):
    for fmt in ROWS:
        result = matrix[(fmt, "untrained base")][1]
        assert not result.untrained.trained and {c.verdict for c in result.conventions} == {"cannot tell"}


def test_a_probe_that_trusts_the_config_fails_the_mutants(matrix):
    """The twin: "as declared" everywhere is wrong on every mutant the probe names."""
    class Trusting:
        def __init__(self, result: Any) -> None:
            self.conventions = [type(c)(**{**c.__dict__, "verdict": "as declared", "follows": c.declared})
                                for c in result.conventions]

    wrong = {key for key, (row, result) in matrix.items()
             if not all(matches(row.truth, Trusting(result), c) for c in CONVENTIONS)}
    assert wrong == {key for key in NAMED if key[1] != "trained"} | {(fmt, "untrained base") for fmt in ROWS}
