"""`eval --plot`: a PNG of acceptance by draft position (the draft, the prompt-lookup baseline, a reference).

matplotlib is optional: `require_matplotlib` names the package when it is missing, and `evaluate` calls it
before the long run, not after it.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dspark_hub.errors import MissingDependencyError
from dspark_hub.format.writer import atomic_path

if TYPE_CHECKING:
    from dspark_hub.train.evaluation.acceptance import Measurement


def require_matplotlib() -> Any:
    """`matplotlib.pyplot` (Agg backend), or a `MissingDependencyError` naming the package."""
    try:
        import matplotlib  # heavy and optional: only `plot` needs it

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise MissingDependencyError("needs matplotlib, which is not installed; pip install matplotlib",
                                     param="plot") from exc
    return plt


def plot_acceptance(draft: Measurement, path: str | os.PathLike[str], *, baseline: Measurement | None = None,
                    reference: Measurement | None = None, force: bool = False) -> Path:
    """PNG of per-position acceptance (draft, baseline, reference) at `path`, written atomically; a file there is
    replaced only with `force`. Needs matplotlib.

    Raises:
        MissingDependencyError: no matplotlib.
        RefusedOverwriteError: a file at `path` and `force` off.
    """
    plt = require_matplotlib()
    figure, axes = plt.subplots(figsize=(6, 4))
    series = [("draft", draft), ("prompt lookup", baseline), ("reference", reference)]
    for label, measurement in series:
        if measurement is None:
            continue
        rates = measurement.overall.per_position
        axes.plot(range(1, len(rates) + 1), rates, marker="o",
                  label=f"{label} (AL {measurement.overall.acceptance_length:.3f})")
    axes.set_xlabel("draft position k")
    axes.set_ylabel("a_k: fraction of steps accepting k drafts")
    axes.set_ylim(0, 1)
    axes.legend()
    figure.tight_layout()
    with atomic_path(path, force=force) as tmp:
        figure.savefig(tmp, dpi=120, format="png")
    plt.close(figure)
    return Path(path)
