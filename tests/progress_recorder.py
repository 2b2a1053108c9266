"""A progress callback that records what the library tells it (`dspark_hub.progress`): totals, plans, steps."""

from __future__ import annotations


class RecordedProgress:
    """`seen` holds `(kind, value)` in order: `("total", n)`, `("plan", plan)`, `("step", n)`."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, object]] = []

    def __call__(self, n: int) -> None:
        self.seen.append(("step", n))

    def set_total(self, total: int) -> None:
        self.seen.append(("total", total))

    def plan(self, plan: object) -> None:
        self.seen.append(("plan", plan))

    @property
    def kinds(self) -> list[str]:
        return [kind for kind, _ in self.seen]
