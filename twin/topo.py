"""`gemtwin hw topo`: tier sizes of a network preset at a GPU count, and a picture of it.

The picture is aggregated: one box per switch domain of each tier, at most ``max_children``
drawn under a parent (the rest folded into one "+M more" box), so 100,000 GPUs draw as fast
and as legibly as 16.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path

import networkx as nx

from hwmodels.network import NetworkPreset


@dataclass(frozen=True, slots=True)
class TierCount:
    name: str
    fabric: str
    domain_gpus: int  # GPUs inside one domain of this tier
    domains: int  # domains of this tier the job's GPUs occupy
    bw_per_gpu_Bps: float
    effective_bw_Bps: float
    latency_s: float
    oversubscription: float


def tier_counts(preset: NetworkPreset, n_gpus: int) -> list[TierCount]:
    """Per tier, inside out, how many of its domains ``n_gpus`` GPUs fill."""
    if n_gpus < 1:
        raise ValueError(f"--gpus ({n_gpus}) must be at least 1")
    if n_gpus > preset.max_gpus:
        raise ValueError(
            f"--gpus ({n_gpus}) exceeds network '{preset.name}' ({preset.max_gpus} GPUs); "
            "pick a larger preset"
        )
    out = []
    for t in preset.tiers:
        domains = math.ceil(n_gpus / t.domain_gpus)
        out.append(TierCount(t.name, t.fabric, t.domain_gpus, domains, t.bw_per_gpu_Bps,
                             t.effective_bw_Bps, t.latency_s, t.oversubscription))  # fmt: skip
        if domains == 1:
            break  # outer tiers are not used by this job
    return out


def aggregated_graph(preset: NetworkPreset, n_gpus: int, *, max_children: int = 4) -> nx.DiGraph:
    """Tree of domains: root = the outermost tier used, leaves = NVLink domains (GPU groups).

    Node attributes: ``level`` (0 = root), ``label``; a folded node stands for ``count`` siblings.
    """
    tiers = tier_counts(preset, n_gpus)
    g = nx.DiGraph()
    top = tiers[-1]
    g.add_node("root", level=0, label=f"{top.name}\n{min(n_gpus, top.domain_gpus)} GPUs")
    _expand(g, "root", tiers, len(tiers) - 1, n_gpus, max_children)
    return g


def _expand(g: nx.DiGraph, parent: str, tiers, i: int, gpus: int, max_children: int) -> None:
    if i == 0:
        return
    inner = tiers[i - 1]
    children = math.ceil(gpus / inner.domain_gpus)
    shown = children if children <= max_children else max_children - 1
    level = g.nodes[parent]["level"] + 1
    for c in range(shown):
        sub = min(inner.domain_gpus, gpus - c * inner.domain_gpus)
        node = f"{parent}/{c}"
        g.add_node(node, level=level, label=f"{inner.name} {c}\n{sub} GPUs")
        g.add_edge(parent, node)
        _expand(g, node, tiers, i - 1, sub, max_children)
    if shown < children:
        node = f"{parent}/more"
        g.add_node(node, level=level, label=f"+{children - shown} more\n{inner.name} domains")
        g.add_edge(parent, node)


def draw_topology(preset: NetworkPreset, n_gpus: int, path: str | os.PathLike[str]) -> Path:
    """Draw the aggregated tree to a PNG (written to a temp name, then renamed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    depth = len(tier_counts(preset, n_gpus))
    g = aggregated_graph(preset, n_gpus, max_children=4 if depth <= 3 else 3)
    pos = _tree_layout(g)
    width = max(6.0, 1.2 * sum(1 for n in g if g.out_degree(n) == 0))
    fig, ax = plt.subplots(figsize=(min(width, 40.0), 1.6 * (1 + _depth(g))))
    nx.draw_networkx_edges(g, pos, ax=ax, arrows=False, edge_color="#888")
    for node, (x, y) in pos.items():
        ax.text(x, y, g.nodes[node]["label"], ha="center", va="center", fontsize=7,
                bbox=dict(boxstyle="round", fc="#e8f0fe", ec="#3b6fb6"))  # fmt: skip
    tiers = tier_counts(preset, n_gpus)
    left = min(x for x, _ in pos.values()) - 1.0
    for level, t in enumerate(reversed(tiers)):  # what a GPU gets through each tier
        ax.text(left, -level, f"{t.name}: {t.effective_bw_Bps / 1e9:.0f} GB/s per GPU\n"
                f"{t.latency_s * 1e6:.1f} µs/step, 1:{t.oversubscription:g}", ha="right",
                va="center", fontsize=7, color="#555")  # fmt: skip
    ax.set_title(f"{preset.name}: {n_gpus} GPUs — " + ", ".join(
        f"{t.domains} × {t.name} ({t.domain_gpus})" for t in tiers), fontsize=9)  # fmt: skip
    ax.axis("off")
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp.png")
    try:
        fig.savefig(tmp, dpi=120, bbox_inches="tight")
        os.replace(tmp, out)
    finally:
        plt.close(fig)
        tmp.unlink(missing_ok=True)
    return out


def _depth(g: nx.DiGraph) -> int:
    return max(d["level"] for _, d in g.nodes(data=True))


def _tree_layout(g: nx.DiGraph) -> dict[str, tuple[float, float]]:
    """Leaves evenly spaced left to right; each parent centred over its children."""
    pos: dict[str, tuple[float, float]] = {}
    next_x = [0.0]

    def place(node: str) -> float:
        kids = list(g.successors(node))
        x = sum(place(k) for k in kids) / len(kids) if kids else next_x[0]
        if not kids:
            next_x[0] += 1.4
        pos[node] = (x, -float(g.nodes[node]["level"]))
        return x

    place("root")
    return pos
