"""How an eval decodes: greedy, or sampled as vLLM samples (`eval --temperature`, truncation, drafting method,
samples a prompt, seed), checked once (`eval_sampling`) and carried by every eval document (`sampling`).

The target's paths follow it (`paths`), the sampled verification reads its temperature, truncation and drafting
method (`sampled_eval`), and `compare` pairs two evals only when they sample the same laws.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from dspark_hub.documents import Document
from dspark_hub.errors import UsageError
from dspark_hub.train.evaluation.acceptance import SIMULATION
from dspark_hub.train.evaluation.sampled_acceptance import DRAFT_SAMPLE_METHODS, Sampling

#: What a sampled simulated number is, in a card's label (`simulated (<this>, k=K, ...)`).
SAMPLED_SIMULATION = "vLLM's rejection-sampling verify loop on the target's float32 sampled paths"

#: Samples per prompt when a temperature is given and `samples` is not (docs/acceptance.md says why).
DEFAULT_SAMPLES = 2


@dataclass(frozen=True)
class EvalSampling(Document):
    """How an eval decodes: greedy (temperature 0, one path a prompt) or sampled as vLLM samples.

    `draft_sample_method` is vLLM's `speculative_config.draft_sample_method` (greedy: the draft's argmax
    at any temperature, verified as a one-hot q); `samples` paths a prompt, each with its own random
    stream from `seed`.
    """

    KEYS = ("temperature", "top_k", "top_p", "min_p", "draft_sample_method", "samples", "seed", "describe")

    sampling: Sampling = field(default_factory=Sampling)
    draft_sample_method: str = "greedy"
    samples: int = 1
    seed: int | None = None

    @property
    def temperature(self) -> float:
        return self.sampling.temperature

    @property
    def top_k(self) -> int:
        return self.sampling.top_k

    @property
    def top_p(self) -> float:
        return self.sampling.top_p

    @property
    def min_p(self) -> float:
        return self.sampling.min_p

    @property
    def greedy(self) -> bool:
        return self.sampling.greedy

    def describe(self) -> str:
        """`greedy`, or `temperature 1, top-p 0.9; greedy drafting; 4 samples a prompt (seed 0)`."""
        if self.greedy:
            return "greedy"
        return (f"{self.sampling.describe()}; {self.draft_sample_method} drafting; "
                f"{self.samples} sample{'s' if self.samples != 1 else ''} a prompt (seed {self.seed})")

    def same_distribution(self, other: EvalSampling) -> bool:
        """Whether two evals sample the same laws (the seed and the sample count may differ)."""
        return (self.sampling, self.draft_sample_method) == (other.sampling, other.draft_sample_method)


GREEDY = EvalSampling()


def eval_sampling(temperature: float = 0.0, *, top_k: int = 0, top_p: float = 1.0, min_p: float = 0.0,
                  draft_sample_method: str = "greedy", samples: int | None = None, seed: int = 0) -> EvalSampling:
    """The decoding of one eval, checked.

    Raises:
        UsageError: a bad sampling parameter, truncation or samples or a drafting method without a
            temperature (greedy decoding has one path a prompt), or samples below 1.
    """
    sampling = Sampling(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p)
    if draft_sample_method not in DRAFT_SAMPLE_METHODS:
        raise UsageError(f"{draft_sample_method!r}; use one of {', '.join(DRAFT_SAMPLE_METHODS)} (vLLM's "
                         "draft_sample_method)", param="draft_sample_method")
    if sampling.greedy:
        if samples not in (None, 1):
            raise UsageError("greedy decoding has one path a prompt; samples need a temperature above 0",
                             param="samples")
        if draft_sample_method != "greedy":
            raise UsageError("at temperature 0 vLLM drafts and verifies greedily; the drafting method needs a "
                             "temperature above 0", param="draft_sample_method")
        return GREEDY
    if samples is not None and samples < 1:
        raise UsageError(f"{samples}; pass 1 or more samples a prompt", param="samples")
    return EvalSampling(sampling, draft_sample_method, DEFAULT_SAMPLES if samples is None else samples, seed)


def simulated_decoding(sampling: EvalSampling) -> dict[str, Any]:
    """How a simulated eval decoded, as its harness and its profile's conditions say it."""
    if sampling.greedy:
        return {"decoding": "greedy", "temperature": 0.0, "simulation": SIMULATION}
    return {"decoding": "sampled", "temperature": sampling.temperature, "simulation": SAMPLED_SIMULATION,
            "sampling": sampling.describe()}
