"""`eval`'s walk: the draft followed through the code (`bench/walk.py`) comes back to a `train` module it had left
at most four times (issue 30's limit). It was 11 before `train/evaluation` became three steps (open the inputs,
choose the drafters, count), and 10 once the serving answers and the sampled eval had each added a path of their
own; one count for both (`acceptance.measure_lanes`, judged by the eval's verifier) brought it to 3: the count
(`serving` -> `acceptance`, whose greedy comparison the sampled verifier also uses) and vLLM's request seeds
(`vllm_eval` -> `sampled_acceptance.stream_seed`, the one home of the stream rule)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench"


@pytest.fixture
def walk(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))
    import walk as module

    return module


def test_evals_walk_returns_to_a_train_module_at_most_four_times(walk):
    stops = walk.walk("dspark_hub/cli/train.py:eval_command:draft")
    in_train = walk.stays([stop for stop in stops if stop[0].startswith("dspark_hub.train.")])
    assert walk.returns(in_train) <= 4, " -> ".join(in_train)
    # the three steps are on the walk: open the inputs, choose the drafters, count (one lockstep pass)
    assert {("dspark_hub.train.evaluation.inputs", "open_inputs"), ("dspark_hub.train.evaluation.drafters",
            "choose_drafters"), ("dspark_hub.train.evaluation.serving", "measure_serving"),
            ("dspark_hub.train.evaluation.acceptance", "measure_lanes")} <= set(stops)


def write_package(root: Path, modules: dict[str, str]) -> None:
    for name, source in {"__init__": "", **modules}.items():
        (root / "pkg").mkdir(exist_ok=True)
        (root / "pkg" / f"{name}.py").write_text(textwrap.dedent(source))


def test_a_walk_that_bounces_between_two_modules_is_counted(walk, tmp_path):
    write_package(tmp_path, {
        "a": """
            from pkg.b import g, k

            def f(x):
                y = g(x)          # into b (a name made from x by our call is followed)
                h(y)              # back to a: a return
                k(len(x))         # len is not ours: the name it makes is put down, the call still hands x on

            def h(value):
                return value
        """,
        "b": """
            from pathlib import Path

            def g(x):
                return x

            def k(n):
                folder = Path(n)  # put down in Path: not followed
                unused(folder)

            def unused(folder):
                return folder
        """})
    stops = walk.walk("pkg/a.py:f:x", root=tmp_path, package="pkg")
    assert stops == [("pkg.a", "f"), ("pkg.b", "g"), ("pkg.a", "h"), ("pkg.b", "k")]
    assert walk.stays(stops) == ["pkg.a", "pkg.b", "pkg.a", "pkg.b"] and walk.returns(walk.stays(stops)) == 2


def test_a_walk_that_goes_down_once_has_no_return(walk, tmp_path):
    write_package(tmp_path, {
        "a": """
            from pkg import b

            def f(x):
                h(x)
                b.g(x)

            def h(x):
                return x
        """,
        "b": """
            def g(x):
                return x
        """})
    stops = walk.walk("pkg/a.py:f:x", root=tmp_path, package="pkg")
    assert walk.stays(stops) == ["pkg.a", "pkg.b"] and walk.returns(walk.stays(stops)) == 0
