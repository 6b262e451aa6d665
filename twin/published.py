"""The twin against published DLRM training results it was never fitted to: ``gemtwin published``.

``twin/data/published/dlrm_a100.yaml`` holds 27 published A100 results (MLPerf Training v1.0-v3.0,
DeepLearningExamples, TorchRec, SOK), each with its citation. ``twin_setup.yaml`` beside it says how
the twin reads each one: its software stack (tables, precision, CUDA graphs), network preset, table
rows and, for HugeCTR's hybrid embedding, the parameters of its frequency rule. ``scenario_of``
builds the Scenario from those facts alone; nothing is fitted to a throughput.

Each row compares the twin's samples/s with the published training throughput (evaluation time
removed where the source allows: ``train_only``), and each series that one source measured at
several GPU counts compares the ratios to its first point (the strong-scaling check). A row whose
system depends on a mechanism the twin lacks names it (``twin_setup.yaml`` ``missing``).

HugeCTR's hybrid embedding (``hybrid_hot_rows``) keeps a table's frequent categories data-parallel.
Its rule, as HugeCTR's ``hybrid_embedding_calibration.cpp`` states it: on one node (NVLink) a
category is frequent when the chance that it appears twice in a GPU's batch of M samples,
``M (M-1) p^2 / 2``, reaches ``p_dup_max``; across nodes when its expected count in the global batch
reaches ``ratio · nodes · (all_to_all_bw / all_reduce_bw) · nodes / (nodes - 1)`` (the config's
1.9e11 and 1.3e11; read here as a count per batch, an interpretation: the source's branch is a
draft). Frequent ids are the hottest under the dataset's id law (``scenarios.distributions``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Optional

import numpy as np
import typer
import yaml

import scenarios
from scenarios.distributions import id_cdf
from scenarios.loader import validate

DATA = Path(__file__).resolve().parent / "data" / "published"
A2A_BW, AR_BW = 1.9e11, 1.3e11  # HybridEmbeddingParam's max_all_to_all / max_all_reduce bandwidth (every config)
GPUS_PER_NODE = 8


@dataclass(frozen=True)
class Published:
    """The two files, parsed."""

    results: dict[str, dict[str, Any]]  # dlrm_a100.yaml results by id
    models: dict[str, dict[str, Any]]
    setup: dict[str, Any]

    @classmethod
    def load(cls, folder: Path = DATA) -> Published:
        data = yaml.safe_load((folder / "dlrm_a100.yaml").read_text(encoding="utf-8"))
        setup = yaml.safe_load((folder / "twin_setup.yaml").read_text(encoding="utf-8"))
        results = {r["id"]: r for r in data["results"]}
        unread = sorted(set(results) - set(setup["results"]))
        if unread:
            raise ValueError(f"twin_setup.yaml has no entry for {', '.join(unread)}; add one under results")
        return cls(results, data["models"], setup)


@dataclass(frozen=True)
class Row:
    """One published result against the twin."""

    id: str
    stack: str
    gpus: int
    global_batch: int
    published: float  # samples/s
    basis: str  # which published number: train_only or published
    twin: float  # samples/s
    step_s: float
    fits: bool
    missing: tuple[str, ...] = ()
    hot_share: float | None = None  # hybrid: the share of lookups on data-parallel rows

    @property
    def error(self) -> float:
        return self.twin / self.published - 1


@dataclass(frozen=True)
class Scaling:
    """A series' throughput at each point over its first point's, published and twin."""

    series: str
    points: tuple[str, ...]
    gpus: tuple[int, ...]
    published: tuple[float, ...]
    twin: tuple[float, ...]
    strong: bool
    why: str = ""

    @property
    def errors(self) -> tuple[float, ...]:
        return tuple(t / p - 1 for t, p in zip(self.twin[1:], self.published[1:]))


@dataclass
class Comparison:
    rows: list[Row] = field(default_factory=list)
    scaling: list[Scaling] = field(default_factory=list)


# ---- scenarios -------------------------------------------------------------------------------------
def _value(x):
    return x["value"] if isinstance(x, dict) and "value" in x else x


def _rows_and_pooling(pub: Published, key: str) -> tuple[list[int], list[int]]:
    if key in pub.setup["rows"]:
        rows = _value(pub.setup["rows"][key])
        return rows, [1] * len(rows)
    model, _, variant = key.partition(":")
    m = pub.models[model]
    rows = _value(m[variant or "table_rows"])
    return rows, _value(m["multi_hot_sizes"]) if "multi_hot_sizes" in m else [1] * len(rows)


def hybrid_hot_rows(rows: int, skew: float, *, batch: int, gpus: int, p_dup_max: float | None = None,
                    ratio: float | None = None) -> int:
    """Frequent categories of one table under HugeCTR's hybrid-embedding rule (module docstring):
    ``p_dup_max`` on one node, ``ratio`` (efficiency_bandwidth_ratio) across nodes."""
    if p_dup_max is not None:
        m = batch / gpus
        p_min = math.sqrt(2.0 * p_dup_max / (m * (m - 1.0)))
    else:
        nodes = max(2, gpus // GPUS_PER_NODE)
        p_min = ratio * nodes * (A2A_BW / AR_BW) * nodes / (nodes - 1.0) / batch
    share = lambda k: float(np.diff(id_cdf(np.array([k + 1.0, k + 2.0]), rows, skew))[0])  # noqa: E731
    if share(0) < p_min:
        return 0
    lo, hi = 0, rows  # share(lo) >= p_min; the shares fall with the id
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if share(mid) >= p_min else (lo, mid)
    return lo + 1


def scenario_of(pub: Published, rid: str) -> scenarios.Scenario:
    """The Scenario the twin prices for published result ``rid``."""
    r, how = pub.results[rid], pub.setup["results"][rid]
    stack = pub.setup["stacks"][how["stack"]]
    gpus, batch = int(_value(r["num_gpus"])), int(_value(r["global_batch_size"]))
    gpu = pub.setup["gpus"][r["gpu"]]
    rows, hots = _rows_and_pooling(pub, how["rows"])
    skew = pub.setup["datasets"]["criteo-1tb"]["id_skew"]
    tables = []
    for i, (n, k) in enumerate(zip(rows, hots)):
        t = {"name": f"c{i}", "rows": n, "dim": 128, "pooling": {"max": k}, "id_skew": skew}
        if stack["tables"] == "hybrid" and gpus > 1:
            t["hot_rows"] = hybrid_hot_rows(n, skew, batch=batch, gpus=gpus, **{k: v for k, v in how["hybrid"].items()
                                                                                 if k in ("p_dup_max", "ratio")})
        tables.append(t)
    sharding = "row" if stack["tables"] == "hybrid" else stack["tables"]
    interaction = how.get("interaction", "dot")
    model = {"kind": "dlrm", "dense_features": 13, "bottom_mlp": [512, 256, 128], "interaction": interaction,
             "dcn_layers": 3, "dcn_rank": 512, "top_mlp": [1024, 1024, 512, 256],
             "tasks": {"names": ["click"], "mlp": []}, "embeddings": {"pooled": tables}}
    return validate({
        "name": rid, "description": f"published: {_value(r['system'])}", "model": model,
        "hardware": {"gpu": gpu if isinstance(gpu, str) else gpu["entry"], "num_gpus": gpus, "network": how["network"]},
        "parallelism": {"dense_replicate": gpus, "dense_shard": 1, "sparse_shard": gpus, "sparse_replica": 1,
                        "table_sharding": "auto" if sharding == "auto" else {f"c{i}": sharding for i in range(len(rows))}},
        "precision": {"embeddings": stack["embeddings"], "mlp": stack["mlp"], "attention": "bf16", "comm": stack["comm"]},
        "training": {"global_batch": batch, "micro_batch": batch // gpus, "steps": 1000, "eval_batches": 0},
        "execution": {"cuda_graphs": stack["cuda_graphs"]},
    })  # fmt: skip


def _published(r: dict) -> tuple[float, str]:
    t = r["throughput_samples_per_s"]
    return (float(_value(t["train_only"])), "train_only") if "train_only" in t else (float(_value(t["published"])), "published")


def _hot_share(s: scenarios.Scenario) -> float | None:
    from twin.imbalance import hot_share

    fams = s.model.embeddings.pooled
    if not any(f.hot_rows for f in fams):
        return None
    return float(np.mean([hot_share(f.rows, f.id_skew, f.hot_rows) for f in fams]))


def compare(pub: Published | None = None, *, only: str | None = None) -> Comparison:
    """Every published result (or those whose id contains ``only``) against the twin."""
    from twin.simulate import simulate

    pub = pub or Published.load()
    out = Comparison()
    for rid, r in pub.results.items():
        if only and only not in rid:
            continue
        s = scenario_of(pub, rid)
        res = simulate(s)
        value, basis = _published(r)
        how = pub.setup["results"][rid]
        missing = tuple(pub.setup["stacks"][how["stack"]].get("missing", ())) + tuple(how.get("missing", ()))
        out.rows.append(Row(rid, how["stack"], s.hardware.num_gpus, s.training.global_batch, value, basis,
                            res.samples_per_s, res.step_time_s, res.memory_fits, missing, _hot_share(s)))  # fmt: skip
    by_id = {row.id: row for row in out.rows}
    for name, ser in pub.setup["series"].items():
        pts = [by_id[p] for p in ser["points"] if p in by_id]
        if len(pts) < 2:
            continue
        out.scaling.append(Scaling(name, tuple(p.id for p in pts), tuple(p.gpus for p in pts),
                                   tuple(p.published / pts[0].published for p in pts),
                                   tuple(p.twin / pts[0].twin for p in pts), bool(ser["strong"]), ser.get("why", "")))
    return out


# ---- the tables --------------------------------------------------------------------------------
ROW_TARGET, SCALING_TARGET = 0.15, 0.20  # issue 23: within 15% per system, the scaling ratio within 20%


def _notes(row: Row, pub: Published) -> str:
    out = [f"lacks {', '.join(row.missing)}"] if row.missing else []
    if row.hot_share is not None:
        out.append(f"hot rows {row.hot_share:.0%} of lookups")
    if not row.fits:
        out.append("does not fit the GPU (tables kept in host memory?)")
    return "; ".join(out)


def rows_table(c: Comparison, pub: Published):
    from rich.table import Table

    t = Table(title="published A100 DLRM training throughput against the twin (samples/s)")
    for col, just in [("result", "left"), ("stack", "left"), ("GPUs", "right"), ("batch", "right"),
                      ("published", "right"), ("twin", "right"), ("error", "right"), ("", "left"), ("notes", "left")]:
        t.add_column(col, justify=just, no_wrap=col != "notes")  # type: ignore[arg-type]
    for r in c.rows:
        ok = "ok" if abs(r.error) <= ROW_TARGET else "miss"
        t.add_row(r.id, r.stack, str(r.gpus), f"{r.global_batch:,}", f"{r.published / 1e6:.2f}M",
                  f"{r.twin / 1e6:.2f}M", f"{r.error:+.1%}", ok, _notes(r, pub))
    return t


def scaling_table(c: Comparison):
    from rich.table import Table

    t = Table(title="throughput over each series' first point: published / twin")
    for col, just in [("series", "left"), ("GPUs", "right"), ("published", "right"), ("twin", "right"),
                      ("error", "right"), ("", "left"), ("kind", "left")]:
        t.add_column(col, justify=just)  # type: ignore[arg-type]
    for s in c.scaling:
        errs = s.errors
        ok = "ok" if all(abs(e) <= SCALING_TARGET for e in errs) else "miss"
        t.add_row(s.series, " → ".join(map(str, s.gpus)), " → ".join(f"{x:.2f}" for x in s.published),
                  " → ".join(f"{x:.2f}" for x in s.twin), ", ".join(f"{e:+.0%}" for e in errs), ok,
                  "strong" if s.strong else f"not strong: {s.why}" if s.why else "not strong")
    return t


def summary(c: Comparison) -> str:
    rows_ok = sum(abs(r.error) <= ROW_TARGET for r in c.rows)
    ser_ok = sum(all(abs(e) <= SCALING_TARGET for e in s.errors) for s in c.scaling)
    err = np.array([abs(r.error) for r in c.rows]) if c.rows else np.zeros(1)
    return (f"{rows_ok} of {len(c.rows)} results within {ROW_TARGET:.0%} (median |error| {np.median(err):.1%}, "
            f"max {err.max():.1%}); {ser_ok} of {len(c.scaling)} series' ratios within {SCALING_TARGET:.0%}")


def as_dict(c: Comparison) -> dict:
    from dataclasses import asdict

    return {"rows": [asdict(r) | {"error": r.error} for r in c.rows],
            "scaling": [asdict(s) | {"errors": list(s.errors)} for s in c.scaling], "summary": summary(c)}


def published_command(
    only: Annotated[Optional[str], typer.Option("--only", help="Only the results whose id contains this, e.g. torchrec.")] = None,
    json_out: Annotated[Optional[Path], typer.Option("--json", help="Write the rows and series as JSON here.")] = None,
    scenarios_out: Annotated[Optional[Path], typer.Option("--scenarios", help="Write each result's scenario YAML into this folder.")] = None,
) -> None:  # fmt: skip
    """The twin against published A100 DLRM training results it was never fitted to (MLPerf
    Training v1.0-v3.0, DeepLearningExamples, TorchRec, SOK; twin/data/published), each priced from
    its own published configuration: a row per result, a row per series of GPU counts."""
    from twin.console import out as con
    from twin.runrecord import write_json_atomic

    pub = Published.load()
    if only is not None and not any(only in rid for rid in pub.results):
        raise ValueError(f"--only {only!r} matches no result; ids look like {next(iter(pub.results))}")
    c = compare(pub, only=only)
    con.print(rows_table(c, pub))
    if c.scaling:
        con.print(scaling_table(c))
    con.print(summary(c), soft_wrap=True)
    for name, text in pub.setup["missing"].items():
        if any(name in r.missing for r in c.rows):
            con.print(f"lacks {name}: {text}", soft_wrap=True)
    if json_out is not None:
        write_json_atomic(json_out, as_dict(c))
        con.print(f"wrote {json_out}")
    if scenarios_out is not None:
        _write_scenarios(pub, [r.id for r in c.rows], scenarios_out)
        con.print(f"wrote {len(c.rows)} scenarios into {scenarios_out}")


def _write_scenarios(pub: Published, ids: list[str], folder: Path) -> None:
    from scenarios.files import write_text_atomic

    folder.mkdir(parents=True, exist_ok=True)
    for rid in ids:
        data = scenario_of(pub, rid).model_dump(mode="json", by_alias=True)
        write_text_atomic(folder / f"{rid}.yaml", yaml.safe_dump(data, sort_keys=False))
