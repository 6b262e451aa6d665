"""hwmodels/bench/nccl_sweep.py itself, on 2 gloo ranks (the default run's one multi-process test of
this kind): every kind checked on known values before it is timed, nccl-tests' bus factors, the
zero-CTA path recorded as unavailable off NCCL with its reason, the JSON written whole, and bad
arguments refused in one line."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "hwmodels" / "bench"))
pytest.importorskip("torch")
import nccl_sweep as ns  # noqa: E402


def test_two_gloo_ranks_sweep_every_kind(tmp_path):
    out = tmp_path / "sweep.json"
    assert ns.main(["--nproc", "2", "--device", "cpu", "--max-bytes", "8192", "--paths", "sm,zero_cta",
                    "--out", str(out)]) == 0
    r = json.loads(out.read_text())
    assert r["environment"]["world_size"] == 2 and r["environment"]["backend"] == "gloo"
    assert "no copy-engine path off NCCL" in r["environment"]["unavailable"]["zero_cta"]
    assert {(row["kind"], row["msg_bytes"]) for row in r["rows"]} == {
        (k, m) for k in ns.KINDS for m in (4, 1024, 8192)}
    for row in r["rows"]:
        assert row["path"] == "sm" and row["time_s"] > 0
        assert row["bus_bw_Bps"] == pytest.approx(row["alg_bw_Bps"] * ns.bus_factor(row["kind"], 2))
    assert not list(tmp_path.glob("*.tmp"))


def test_the_check_catches_a_wrong_result():
    """The check is real: on a 1-rank group, a reduction the check expects from 2 ranks fails, the
    same with the right group size passes."""
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        cpu = torch.device("cpu")
        for kind in ("all_reduce", "all_gather", "all_to_all"):
            ns.make_op(kind, 1024, 1, 0, cpu)[1]()
        with pytest.raises(RuntimeError, match="all_reduce of 1,024 bytes gave wrong values on rank 0"):
            ns.make_op("all_reduce", 1024, 2, 0, cpu)[1]()
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("argv,msg", [(["--nproc", "1"], "--nproc 1: a sweep needs at least 2 ranks"),
                                      (["--kinds", "gather"], "--kinds: 'gather' is not one of"),
                                      (["--paths", "ce"], "--paths: 'ce' is not one of")])
def test_bad_arguments_are_one_line_errors(argv, msg, capsys):
    with pytest.raises(SystemExit) as e:
        ns.parse_args(["--out", "x.json", *argv])
    assert e.value.code == 2 and msg in capsys.readouterr().err
