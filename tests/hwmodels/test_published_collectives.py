"""The collective model against published nccl-tests results (hwmodels/data/published/
nccl_collectives.yaml; print the table with ``python -m hwmodels.published``).

The bounds below are the errors the model reaches, not targets: time error = predicted /
published - 1, rows chosen before pricing (the YAML says how), nothing fitted to them. What they
show and why (hwmodels/GROUPS.md): inside one NVLink domain (4, 8, 64 GB300s) the all-to-all is
within 40% (the large-message a2a efficiency on NVL72 is ~0.76 of the link, the preset's 0.93 is
the all-reduce's); across two racks (128 GPUs) the model misses by up to 4x both ways (serial
per-peer network latency over-predicts small sizes; the published large-size rate is a quarter
of the NICs' line rate, which nothing in the preset explains); two 8 x H100 IB nodes: -9%.
"""

from __future__ import annotations

import math
import statistics

import pytest

from hwmodels._data import load_yaml
from hwmodels.published import compare

ROWS = compare()


def _errors(**match) -> list[float]:
    rows = [r for r in ROWS if all(getattr(r, k) == v for k, v in match.items())]
    assert rows, match
    return [r.error for r in rows]


def test_every_row_cites_its_source():
    data = load_yaml("published/nccl_collectives.yaml")
    for r in data["rows"]:
        src = data["sources"][r["source"]]
        assert src["url"].startswith("https://github.com/") and src["where"] and src["hardware"]
        assert r["system"] in data["systems"]
    assert len(ROWS) == len(data["rows"]) == 33


def test_all_to_all_inside_one_nvlink_domain():
    errs = [e for n in (4, 8, 64) for e in _errors(kind="all_to_all", system="oci-gb300", gpus=n)]
    assert len(errs) == 12
    assert max(map(abs, errs)) <= 0.40
    assert statistics.median(map(abs, errs)) <= 0.27


def test_all_to_all_across_two_racks_fits_its_small_messages_and_misses_the_largest():
    """The 1 MiB row set the per-peer cost across NICs (hwmodels.collectives.NIC_PEER_LATENCY_S); 16 MiB
    and 256 MiB are checks; 16 GiB runs at a quarter of the NICs' line rate, which nothing here explains."""
    errs = _errors(kind="all_to_all", system="oci-gb300", gpus=128)
    assert abs(errs[0]) <= 0.05 and abs(errs[1]) <= 0.10 and abs(errs[2]) <= 0.20
    assert errs[-1] < -0.5  # too fast at 16 GiB


def test_all_to_all_two_h100_nodes():
    (err,) = _errors(kind="all_to_all", system="h100-ib")
    assert abs(err) <= 0.10


def test_all_reduce_rows_as_reported():
    errs = _errors(kind="all_reduce")
    assert len(errs) == 16 and max(map(abs, errs)) <= 0.80
    assert statistics.median(map(abs, errs)) <= 0.33
