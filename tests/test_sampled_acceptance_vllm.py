"""`train.evaluation.sampled_acceptance` against vLLM 0.32.0's own sampling kernels (executed, in the interpreter).

One child process of the vLLM interpreter (tests/vllm_sampling_child.py) runs, on logits given here:
the rejection sampler of Model Runner V2 (`rejection_sample`: verify, residual, bonus) once per request
with 200 seeds, the draft sampler (`gumbel_sample` with `is_drafting`), and the target's temperature,
min-p and top-k/top-p steps. The sampled outcomes must pass a chi-square test (0.001 false alarms)
against our exact law, and fail it against a twin that reads vLLM differently.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest
import torch

from dspark_hub.train.evaluation import sampled_acceptance as sa
from tests.sampling_toys import chi_square, chi_square_limit, make_toy

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[1]
REQUESTS = 200
DRAWS = 300
GREEDY_DRAFTING = sa.Sampling(temperature=1.0)
PROBABILISTIC = sa.Sampling(temperature=0.8, top_k=3, top_p=0.7)
PROCESS = [sa.Sampling(0.7, min_p=0.1), sa.Sampling(1.3, top_k=4), sa.Sampling(0.9, top_p=0.8),
           sa.Sampling(1.1, top_k=5, top_p=0.7, min_p=0.05), sa.Sampling(1.0, top_p=0.5)]
DRAW_LOGITS = [0.3, -1.2, 1.1, 0.0, 0.8, -0.4]
DRAW_TEMPERATURE = 0.5


def block(seed: int, sampling: sa.Sampling, method: str, likeness: float, scale: float):
    """A toy block: target logits after the drafts, the draft's raw logits and its drafts (the toys are
    picked so that each twin's law is far from ours: 200 requests reject it with near certainty)."""
    toy = make_toy(seed, vocab=6, k=2, likeness=likeness, scale=scale)
    drafts = sa.draw_drafts(toy.draft(1), toy.k, sampling, method, sa.make_generator(seed, "vllm", 0, "draft"))
    raw = [toy.draft(1)(drafts.tokens[:i]) for i in range(toy.k)]
    target = [toy.target_logits([0, 1, *drafts.tokens[:i]]) for i in range(toy.k + 1)]
    return target, raw, drafts.tokens


def law_of(target, raw, drafts, sampling: sa.Sampling, q_of) -> dict[tuple[int, int], float]:
    p_rows = torch.stack([sa.target_probs(row, sampling) for row in target])
    q_rows = torch.stack([q_of(row) for row in raw])
    return {(b.accepted, x): b.weight * float(b.next_token[x])
            for b in sa.verification_law(p_rows, q_rows, drafts) for x in range(p_rows.shape[-1])
            if b.weight * float(b.next_token[x]) > 0}


def pooled_chi_square(counts: dict, law: dict, n: int) -> tuple[float, int]:
    """Chi-square with the cells expected below 5 pooled into one; (statistic, degrees of freedom)."""
    big = {key for key, p in law.items() if n * p >= 5}
    rest_p = sum(p for key, p in law.items() if key not in big)
    rest_count = sum(c for key, c in counts.items() if key not in big)
    cells = {key: law[key] for key in big}
    observed = {key: counts.get(key, 0) for key in big}
    if rest_p > 0:
        cells["rest"], observed["rest"] = rest_p, rest_count
    return chi_square(observed, cells, n), len(cells) - 1


def rejected(counts: dict, law: dict, n: int = REQUESTS) -> bool:
    statistic, df = pooled_chi_square(counts, law, n)
    return statistic > chi_square_limit(df)


def as_lists(rows: Sequence[torch.Tensor]) -> list[list[float]]:
    return [row.float().tolist() for row in rows]


CASES = {"greedy": block(5, GREEDY_DRAFTING, "greedy", 1.5, 1.0),
         "probabilistic": block(3, PROBABILISTIC, "probabilistic", 2.0, 0.6)}


@pytest.fixture(scope="module")
def vllm_runs() -> dict:
    g = torch.Generator().manual_seed(8)
    process_logits = [torch.randn(12, generator=g).tolist() for _ in PROCESS]
    job = {
        "verify": [
            {"target_logits": as_lists(CASES["greedy"][0]), "draft_logits": None, "drafts": CASES["greedy"][2],
             "temperature": GREEDY_DRAFTING.temperature, "requests": REQUESTS},
            {"target_logits": as_lists([sa.processed_logits(row.float(), PROBABILISTIC)
                                        for row in CASES["probabilistic"][0]]),
             "draft_logits": as_lists(CASES["probabilistic"][1]), "drafts": CASES["probabilistic"][2],
             "temperature": PROBABILISTIC.temperature, "requests": REQUESTS}],
        "draw": {"logits": DRAW_LOGITS, "temperature": DRAW_TEMPERATURE, "requests": DRAWS},
        "process": [{"logits": logits, "temperature": s.temperature, "min_p": s.min_p, "top_k": s.top_k,
                     "top_p": s.top_p} for logits, s in zip(process_logits, PROCESS, strict=True)],
    }
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, str(ROOT / "tests" / "vllm_sampling_child.py")], input=json.dumps(job),
                          capture_output=True, text=True, cwd=ROOT, env=env, timeout=900, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    reply = json.loads(done.stdout)
    reply["process_logits"] = process_logits
    return reply


def counts_of(rows: list[list[int]]) -> dict[tuple[int, int], int]:
    return {(j, token): c for j, token, c in rows}


def test_vllms_default_greedy_drafting_verifies_a_one_hot_q(vllm_runs):
    target, raw, drafts = CASES["greedy"]
    counts = counts_of(vllm_runs["verify"][0])
    one_hot = law_of(target, raw, drafts, GREEDY_DRAFTING, lambda row: sa.draft_probs(row, GREEDY_DRAFTING, "greedy"))
    as_softmax = law_of(target, raw, drafts, GREEDY_DRAFTING, lambda row: torch.softmax(row, dim=-1))
    assert not rejected(counts, one_hot)
    assert rejected(counts, as_softmax)


def test_vllms_probabilistic_verification_reads_the_drafts_tempered_logits_untruncated(vllm_runs):
    target, raw, drafts = CASES["probabilistic"]
    counts = counts_of(vllm_runs["verify"][1])
    ours = law_of(target, raw, drafts, PROBABILISTIC, lambda row: sa.draft_probs(row, PROBABILISTIC, "probabilistic"))
    truncated_q = law_of(target, raw, drafts, PROBABILISTIC, lambda row: sa.target_probs(row, PROBABILISTIC))
    assert not rejected(counts, ours)
    assert rejected(counts, truncated_q)


def test_vllm_draws_drafts_from_the_tempered_distribution(vllm_runs):
    counts = dict(enumerate(vllm_runs["draw"]))
    logits = torch.tensor(DRAW_LOGITS, dtype=torch.float64)
    tempered = sa.draft_probs(logits, sa.Sampling(DRAW_TEMPERATURE), "probabilistic")
    assert not rejected(counts, dict(enumerate(tempered.tolist())), DRAWS)
    assert rejected(counts, dict(enumerate(torch.softmax(logits, dim=-1).tolist())), DRAWS)


@pytest.mark.parametrize("index", range(len(PROCESS)))
def test_the_target_distribution_is_vllms(vllm_runs, index):
    theirs = torch.tensor(vllm_runs["process"][index])
    ours = sa.processed_logits(torch.tensor(vllm_runs["process_logits"][index]), PROCESS[index])
    assert torch.equal(torch.isinf(ours), torch.isinf(theirs))
    finite = torch.isfinite(ours)
    assert torch.allclose(ours[finite], theirs[finite], rtol=0, atol=1e-6)
    assert not math.isclose(float(finite.sum()), 12.0)       # every case truncates something
