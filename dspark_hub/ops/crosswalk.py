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
(`verify.rules`).
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from dspark_hub.errors import UsageError
from dspark_hub.format import contract, speculators
from dspark_hub.verify.formats import K3, SPECULATORS, DraftFormat
from dspark_hub.verify.rules import residual_index, taps_from_aux_ids

_LAYER = re.compile(r"^layers\.(\d+)\.(.+)$")
#: Per-layer modules of each format that have no counterpart in the other (its attention).
ATTENTION = {
    K3.name: ("self_attn.q_a_proj.weight", "self_attn.q_a_layernorm.weight", "self_attn.q_b_proj.weight",
              "self_attn.kv_a_proj_with_mqa.weight", "self_attn.kv_a_layernorm.weight", "self_attn.kv_b_proj.weight",
              "self_attn.o_proj.weight"),
    SPECULATORS.name: ("self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight",
                       "self_attn.o_proj.weight", "self_attn.q_norm.weight", "self_attn.k_norm.weight"),
}


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
class Crosswalk:
    """A source checkpoint's tensors against another format's layout."""

    source: DraftFormat
    target: DraftFormat
    mapped: dict[str, str] = field(default_factory=dict)        # source name -> target name
    no_counterpart: list[str] = field(default_factory=list)     # source tensors the target layout cannot hold
    no_source: list[str] = field(default_factory=list)          # target tensors nothing in the source provides
    taps: dict[str, Any] = field(default_factory=dict)          # the tap ids the target config would carry

    @property
    def lossless(self) -> bool:
        return not self.no_counterpart and not self.no_source

    def reason(self) -> str:
        parts = []
        if self.no_counterpart:
            parts.append(f"{', '.join(grouped(self.no_counterpart))} have no counterpart in the {self.target.title} "
                         "layout")
        if self.no_source:
            parts.append(f"{', '.join(grouped(self.no_source))} would have no source")
        return "; ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        return {"source": self.source.name, "target": self.target.name, "lossless": self.lossless,
                "mapped": dict(self.mapped), "no_counterpart": grouped(self.no_counterpart),
                "no_source": grouped(self.no_source), "taps": self.taps}


def crosswalk(tensors: list[str], config: Mapping[str, Any], source: DraftFormat, target: DraftFormat) -> Crosswalk:
    """Map a `source`-format checkpoint's tensor names onto the `target` format's layout.

    Raises:
        UsageError: the two formats are the same (a repair, not a conversion).
    """
    if source is target:
        raise UsageError(f"source and target are both {source.title}; nothing to convert between")
    walk = Crosswalk(source=source, target=target)
    to_k3 = target is K3
    counterpart = speculators.k3_counterpart if to_k3 else speculators.speculators_counterpart
    layers: set[int] = set()
    for name in tensors:
        other = counterpart(name)
        if other is None:
            if to_k3 or name not in contract.FROZEN_TENSORS:   # k3's embed_tokens is the target's: not a loss
                walk.no_counterpart.append(name)
        else:
            walk.mapped[name] = other
        m = _LAYER.match(name)
        if m:
            layers.add(int(m.group(1)))
    walk.no_source = [f"layers.{i}.{module}" for i in sorted(layers) for module in ATTENTION[target.name]]
    if to_k3:
        walk.no_source.append(contract.FROZEN_TENSORS[0])   # speculators never saves the target's embedding
        ids = config.get(speculators.AUX_IDS_KEY)
        if isinstance(ids, list) and all(isinstance(i, int) for i in ids):
            walk.taps = {"target_layer_ids": taps_from_aux_ids(ids), "from": {speculators.AUX_IDS_KEY: ids}}
    else:
        ids = config.get("target_layer_ids")
        if isinstance(ids, list) and all(isinstance(i, int) for i in ids):
            walk.taps = {speculators.AUX_IDS_KEY: [residual_index(i) for i in ids], "from": {"target_layer_ids": ids}}
    return walk
