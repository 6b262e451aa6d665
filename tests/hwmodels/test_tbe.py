"""The table-batched lookup model (``hwmodels.kernels.TbeCurve``), fitted to the H200 lookup sweep,
and how the twin prices the Triton lookups with it (``twin.execution_cost.fused_lookups``)."""

from __future__ import annotations

import numpy as np
import pytest

import scenarios
from hwmodels.bench.fit_tbe import _arrays, excluded, fit, rows
from hwmodels.gpus import get_gpu
from hwmodels.kernels import tbe_curve
from scenarios.distributions import expected_unique_ids
from scenarios.vocab import Direction
from twin.execution_cost import fused_lookups
from twin.flops import model_costs


def test_the_catalogs_curve_is_the_fit_of_the_committed_sweep():
    p = fit(rows(), get_gpu("h200").hbm_bw_Bps)
    c = tbe_curve(get_gpu("h200"))
    assert (c.fwd_fixed_s, c.per_bag_s, c.bwd_fixed_s, c.per_id_s) == pytest.approx(
        (p["fwd_fixed_s"], p["per_bag_s"], p["bwd_fixed_s"], p["per_id_s"]), rel=1e-6)
    assert c.read_Bps == pytest.approx(p["read_eff"] * 4.8e12) and c.update_Bps == pytest.approx(p["update_eff"] * 4.8e12)


def test_it_prices_every_fitted_row_of_the_sweep_within_its_stated_error():
    """forward within 34%, backward (with the fused Adagrad) within 14% of the profiler's device time."""
    cases = [c for c in rows() if not excluded(c)]
    a, curve = _arrays(cases), tbe_curve(get_gpu("h200"))
    for i, c in enumerate(cases):
        shape = dict(ids=c["ids"], bags=c["bags"], unique_rows=c["unique_rows"], row_bytes=a["row_bytes"][i])
        assert curve.time_s("fwd", **shape) / a["fwd_s"][i] - 1 == pytest.approx(0, abs=0.34), c
        assert curve.time_s("bwd", **shape) / a["bwd_s"][i] - 1 == pytest.approx(0, abs=0.14), c


def test_expected_unique_ids_match_the_counts_of_the_sweeps_draws():
    for c in rows():
        want = c["unique_rows"] / c["tables"]
        got = expected_unique_ids(c["rows"], c["skew"], c["batch"] * c["pooling"])
        assert got == pytest.approx(want, rel=0.005), c
    assert expected_unique_ids(100, 1.05, 0) == 0 and expected_unique_ids(10, 0.0, 1e9) == pytest.approx(10)


def test_a_tables_lookups_are_one_call_shared_by_their_families():
    s = scenarios.load("dlrm-dcnv2")
    costs = model_costs(s.model, batch=s.training.micro_batch, precision=s.precision)
    shares = fused_lookups(s, costs, get_gpu(s.hardware.gpu))
    emb = [c for c in costs if c.op_class == "embedding"]
    assert set(shares) == {c.name for c in emb}
    curve = tbe_curve(get_gpu(s.hardware.gpu))
    S = s.parallelism.sparse_shard
    fams = {f"emb.{f.name}": f for f in s.model.embeddings.pooled}
    total = dict(ids=sum(c.lookups for c in emb), bags=sum(c.bags for c in emb),
                 unique_rows=sum(expected_unique_ids(fams[c.name].rows, fams[c.name].id_skew, S * c.lookups) / S
                                 for c in emb), row_bytes=emb[0].row_bytes)  # fmt: skip
    for i, d in enumerate(Direction):
        assert sum(v[i] for v in shares.values()) == pytest.approx(curve.time_s(d, **total))
    # one call, not one per family: the fixed cost once
    assert sum(v[0] for v in shares.values()) < sum(curve.time_s("fwd", ids=c.lookups, bags=c.bags,
                                                                 unique_rows=1.0, row_bytes=c.row_bytes) for c in emb)


def test_no_tbe_model_where_nothing_was_measured_or_the_lookups_run_otherwise():
    s = scenarios.load("debug-cpu")
    costs = model_costs(s.model, batch=s.training.micro_batch, precision=s.precision)
    assert fused_lookups(s, costs, get_gpu("cpu")) == {}  # the cpu family: the curves
    h = scenarios.load("gem-h200-1gpu", ["execution.embedding_kernel=torch"])
    assert fused_lookups(h, model_costs(h.model, batch=8), get_gpu("h200")) == {}  # per-table torch lookups
    h = scenarios.load("gem-h200-1gpu", ["execution.fused_sparse_update=false"])
    assert fused_lookups(h, model_costs(h.model, batch=8), get_gpu("h200")) == {}  # the update elsewhere


def test_bad_calls_get_one_line():
    with pytest.raises(ValueError, match=r"^tbe call: ids \(-1\)"):
        tbe_curve(get_gpu("h200")).time_s("fwd", ids=-1, bags=1, unique_rows=1, row_bytes=4)
    assert np.isfinite(tbe_curve(get_gpu("h200")).time_s("bwd", ids=0, bags=0, unique_rows=0, row_bytes=4))
