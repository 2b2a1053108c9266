"""Which tensors of one draft format have a counterpart in another, and why a conversion is refused.

`convert` rewrites a checkpoint into another format only where the mapping is lossless: every
source tensor has a counterpart of the same role and shape formula, and every target tensor has
a source. Between `k3_dspark` and a speculators DSpark the context path (`fc` <-> `context_proj`,
`hidden_norm` <-> `context_norm`), the final norm, the per-layer norms and MLP, and the Markov
and confidence heads map one to one (`format.speculators.k3_counterpart`). The attention does
not: MLA (`q_a_proj`, `q_a_layernorm`, `q_b_proj`, `kv_a_proj_with_mqa`, `kv_a_layernorm`,
`kv_b_proj`, `o_proj` over `n*v_head_dim`) and GQA (`q_proj`, `k_proj`, `v_proj`, `o_proj`,
`q_norm`, `k_norm`) are different functions of the input, not a renaming. Every valid draft has
at least one layer, so no k3_dspark <-> speculators conversion is lossless and both directions
are refused with the tensors that have no counterpart named; `Crosswalk` keeps the analysis as
data. A mapping would also shift the taps: our `target_layer_ids` = speculators aux ids - 1
(`format.taps`).
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from dspark_hub.documents import Document
from dspark_hub.errors import UsageError
from dspark_hub.format.jsonio import is_int
from dspark_hub.format.registry import DraftFormat

_LAYER = re.compile(r"^layers\.(\d+)\.(.+)$")


def grouped(names: list[str]) -> list[str]:
    """`layers.{0..4}.self_attn.q_proj.weight` for the same module in consecutive layers; other names as they are."""
    by_module: dict[str, list[int]] = defaultdict(list)
    out: list[str] = []
    for name in sorted(names):
        m = _LAYER.match(name)
        if m:
            by_module[m.group(2)].append(int(m.group(1)))
        else:
            out.append(name)
    for module, layers in by_module.items():
        layers.sort()
        if len(layers) == 1:
            span = str(layers[0])
        elif layers == list(range(layers[0], layers[-1] + 1)):
            span = f"{{{layers[0]}..{layers[-1]}}}"
        else:
            span = "{" + ",".join(map(str, layers)) + "}"
        out.append(f"layers.{span}.{module}")
    return out


@dataclass
class Crosswalk(Document):
    """A source checkpoint's tensors against another format's layout."""

    KEYS = ("source=source_name", "target=target_name", "lossless", "mapped", "no_counterpart=missing_counterparts",
            "no_source=missing_sources", "taps")

    source: DraftFormat
    target: DraftFormat
    mapped: dict[str, str] = field(default_factory=dict)        # source name -> target name
    no_counterpart: list[str] = field(default_factory=list)     # source tensors the target layout cannot hold
    no_source: list[str] = field(default_factory=list)          # target tensors nothing in the source provides
    taps: dict[str, Any] = field(default_factory=dict)          # the tap ids the target config would carry

    @property
    def lossless(self) -> bool:
        return not self.no_counterpart and not self.no_source

    @property
    def source_name(self) -> str:
        return self.source.name

    @property
    def target_name(self) -> str:
        return self.target.name

    @property
    def missing_counterparts(self) -> list[str]:
        """`no_counterpart`, numbered runs grouped (`layers.{0..1}.x`)."""
        return grouped(self.no_counterpart)

    @property
    def missing_sources(self) -> list[str]:
        return grouped(self.no_source)

    def reason(self) -> str:
        parts = []
        if self.no_counterpart:
            parts.append(f"{', '.join(grouped(self.no_counterpart))} have no counterpart in the {self.target.title} "
                         "layout")
        if self.no_source:
            parts.append(f"{', '.join(grouped(self.no_source))} would have no source")
        return "; ".join(parts)


def _target_taps(config: Mapping[str, Any], source: DraftFormat, target: DraftFormat) -> dict[str, Any]:
    """The tap ids the target config would carry, and the source ids they come from (empty when unreadable)."""
    native = config.get(source.taps_key)
    ours = source.pairing_keys(config).taps
    if ours is None or not isinstance(native, list) or not all(is_int(i) for i in native):
        return {}
    return {target.taps_key: target.to_native_taps(ours), "from": {source.taps_key: native}}


def crosswalk(tensors: list[str], config: Mapping[str, Any], source: DraftFormat, target: DraftFormat) -> Crosswalk:
    """Map a `source`-format checkpoint's tensor names onto the `target` format's layout.

    Raises:
        UsageError: the two formats are the same (a repair, not a conversion).
    """
    if source is target:
        raise UsageError(f"source and target are both {source.title}; nothing to convert between")
    walk = Crosswalk(source=source, target=target)
    layers: set[int] = set()
    for name in tensors:
        other = target.counterpart(name)
        if other is None:
            if name != source.target_embedding:     # the target's own embedding is not a loss
                walk.no_counterpart.append(name)
        else:
            walk.mapped[name] = other
        m = _LAYER.match(name)
        if m:
            layers.add(int(m.group(1)))
    walk.no_source = [f"layers.{i}.{module}" for i in sorted(layers) for module in target.attention_modules]
    if target.target_embedding is not None and source.target_embedding is None:
        walk.no_source.append(target.target_embedding)     # the source never saves the target's embedding
    walk.taps = _target_taps(config, source, target)
    return walk
