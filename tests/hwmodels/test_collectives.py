"""The collective model against the measured 2xH200 NCCL table (hwmodels/data/measured)."""

import pytest

from hwmodels import COLLECTIVE_KINDS, collective_sms, collective_time_s, get_network, measured_ceilings
from hwmodels.collectives import collective_cost

LENT = get_network("lent-h200x2").tiers[0]
MiB = 1 << 20

# Model error (model / measured - 1) per row of the 2xH200 table, as achieved by the
# lent-h200x2 preset: pinned so a change that moves the fit shows up here.
PINNED_ERROR = {
    ("all_reduce", 1): -0.219, ("all_reduce", 16): +0.151, ("all_reduce", 256): +0.070, ("all_reduce", 1024): +0.146,
    ("all_to_all", 1): -0.375, ("all_to_all", 16): -0.158, ("all_to_all", 256): +0.003, ("all_to_all", 1024): +0.146,
    ("all_gather", 1): +0.375, ("all_gather", 16): -0.060, ("all_gather", 256): -0.092, ("all_gather", 1024): -0.023,
}


def _measured_time_s(row) -> float:
    factor = 1.0 if row.kind == "all_reduce" else 0.5  # nccl-tests bus factor at n = 2
    return factor * row.msg_bytes / row.bus_bw_Bps


def _errors() -> dict[tuple[str, int], float]:
    out = {}
    for row in measured_ceilings("h200").nccl.rows:
        model = collective_time_s(kind=row.kind, msg_bytes=row.msg_bytes, group_size=2, tier=LENT)
        out[(row.kind, row.msg_bytes // MiB)] = model / _measured_time_s(row) - 1
    return out


def test_error_table_is_pinned():
    errors = _errors()
    assert errors.keys() == PINNED_ERROR.keys()
    for key, err in errors.items():
        assert err == pytest.approx(PINNED_ERROR[key], abs=0.005), key


def test_within_16_percent_from_16_MiB_and_40_percent_at_1_MiB():
    for (kind, mib), err in _errors().items():
        assert abs(err) <= (0.16 if mib >= 16 else 0.40), (kind, mib, err)


def test_four_byte_all_reduce_is_latency_bound():
    # 2 steps x 11 us plus the efficiency curve's 2 MiB / 292 GB/s = 7.2 us: +33% on the 22 us
    # measured, the price of the best fit at >= 16 MiB (pinned, not a target).
    t = collective_time_s(kind="all_reduce", msg_bytes=4, group_size=2, tier=LENT)
    assert t / measured_ceilings("h200").nccl.all_reduce_4B_latency_s - 1 == pytest.approx(0.326, abs=0.005)


@pytest.mark.parametrize("kind", COLLECTIVE_KINDS)
def test_monotonic_in_message_size_and_zero_for_one_rank(kind):
    tier = get_network("h100-roce-3tier").tiers[1]
    sizes = [0, 1, 1024, MiB, 16 * MiB, 256 * MiB, 1 << 30]
    times = [collective_time_s(kind=kind, msg_bytes=m, group_size=16, tier=tier) for m in sizes]
    assert times == sorted(times) and times[0] > 0
    assert collective_time_s(kind=kind, msg_bytes=1 << 30, group_size=1, tier=tier) == 0.0


def test_large_message_approaches_bus_bandwidth():
    tier = get_network("h100-ib").tiers[1]  # 400G IB leaf: 50 GB/s x 0.96
    n, m = 64, 1 << 34
    t = collective_time_s(kind="all_reduce", msg_bytes=m, group_size=n, tier=tier)
    assert 2 * (n - 1) / n * m / t == pytest.approx(48e9, rel=0.01)


def test_oversubscription_divides_bandwidth():
    spine, superspine = get_network("h100-roce-3tier").tiers[2:]
    cost = dict(kind="all_gather", msg_bytes=1 << 30, group_size=8)
    t_spine = collective_cost(**cost, tier=spine).transfer_s
    assert collective_cost(**cost, tier=superspine).transfer_s == pytest.approx(7 * t_spine)


def test_bad_inputs():
    with pytest.raises(ValueError) as e:
        collective_time_s(kind="allreduce", msg_bytes=1, group_size=2, tier=LENT)
    assert str(e.value) == ("unknown collective kind 'allreduce'; known: all_reduce, reduce_scatter, all_gather, "
                            "all_to_all, broadcast, send_recv")
    with pytest.raises(ValueError, match=r"^all_reduce: msg_bytes \(-1\) must be >= 0"):
        collective_time_s(kind="all_reduce", msg_bytes=-1, group_size=2, tier=LENT)


def test_collective_sms():
    nvlink, leaf = get_network("h100-ib").tiers[:2]
    assert collective_sms(kind="all_gather", sm_free=True, tier=nvlink) == 0
    assert collective_sms(kind="all_reduce", sm_free=False, tier=nvlink) == 24
    assert collective_sms(kind="all_to_all", sm_free=False, tier=leaf) == 16
    assert collective_sms(kind="send_recv", sm_free=False, tier=leaf) == 8
    with pytest.raises(ValueError) as e:
        collective_sms(kind="all_reduce", sm_free=True, tier=nvlink)
    assert str(e.value) == ("sm_free all_reduce is not possible on tier 'nvlink' (nvlink): copy engines only do "
                            "all_gather, all_to_all inside an NVLink domain; set sm_free=False")
    with pytest.raises(ValueError, match="sm_free all_gather is not possible on tier 'leaf' \\(infiniband\\)"):
        collective_sms(kind="all_gather", sm_free=True, tier=leaf)
