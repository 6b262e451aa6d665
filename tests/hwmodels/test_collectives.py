"""The collective model against its anchors: `anchor_table()` prints predicted vs measured/published.

Anchors (ANCHORS.md "Collectives" and hwmodels/data/measured/h200_2026-11-30.yaml):
- 2xH200 NV18: every row of the measured NCCL table (all_reduce, all_to_all, all_gather at 1, 16,
  256 MiB and 1 GiB) and the 22 us 4-byte all-reduce, within 10%. The lent tier's efficiency
  points are fitted through these rows, so this pins the data path, not a prediction.
- 8xH100 NVLink ring / all-gather bus bw 360-370 GB/s, NVLS all-reduce ~480, one 400G NIC 46-49,
  GB200 NVL72 all-reduce 835-847, small all-reduce ~12 us in a node (8 GPUs) and ~46 us across
  two nodes (16 GPUs): within 15% of the band's middle.
"""

import pytest

from hwmodels import COLLECTIVE_KINDS, collective_sms, collective_time_s, get_network, measured_ceilings
from hwmodels.collectives import ALGORITHMS, CollectiveCost, algorithms_for, bus_factor, collective_cost

MiB, GiB = 1 << 20, 1 << 30
LENT = get_network("h200x2-nv18")


def _busbw(kind, m, n, net, stride=1, algorithm=None):
    c = collective_cost(kind=kind, msg_bytes=m, group_size=n, network=get_network(net), stride=stride,
                        algorithm=algorithm)
    return m / c.time_s * bus_factor(kind, n)


# (what, predicted, anchor, tolerance)
def anchor_table() -> list[tuple[str, float, float, float]]:
    rows = []
    nccl = measured_ceilings("h200").nccl
    for r in nccl.rows:
        t = collective_time_s(kind=r.kind, msg_bytes=r.msg_bytes, group_size=2, network=LENT)
        measured = bus_factor(r.kind, 2) * r.msg_bytes / r.bus_bw_Bps
        rows.append((f"2xH200 {r.kind} {r.msg_bytes // MiB} MiB time_s", t, measured, 0.10))
    t4 = collective_time_s(kind="all_reduce", msg_bytes=4, group_size=2, network=LENT)
    rows.append(("2xH200 all_reduce 4 B time_s", t4, nccl.all_reduce_4B_latency_s, 0.10))
    big = 8 * GiB
    rows += [
        ("8xH100 NVLink ring all_reduce busbw", _busbw("all_reduce", big, 8, "h100-ib", algorithm="ring"), 365e9, 0.15),
        ("8xH100 NVLink all_gather busbw", _busbw("all_gather", big, 8, "h100-ib"), 365e9, 0.15),
        ("8xH100 NVLS all_reduce busbw", _busbw("all_reduce", big, 8, "h100-ib"), 480e9, 0.15),
        ("400G NIC (IB) all_reduce busbw, 2 nodes x 1 GPU", _busbw("all_reduce", big, 2, "h100-ib", stride=8), 47.5e9, 0.15),
        ("400G NIC (RoCE) all_reduce busbw, 2 nodes x 1 GPU",
         _busbw("all_reduce", big, 2, "h100-roce-3tier", stride=8), 47.5e9, 0.15),
        ("GB200 NVL72 all_reduce busbw", _busbw("all_reduce", big, 72, "gb200-nvl72"), 841e9, 0.15),
        ("8xH100 small all_reduce time_s", collective_time_s(kind="all_reduce", msg_bytes=8, group_size=8,
                                                             network=get_network("h100-ib")), 12e-6, 0.15),
        ("2x8 H100 small all_reduce time_s", collective_time_s(kind="all_reduce", msg_bytes=8, group_size=16,
                                                               network=get_network("h100-ib")), 46e-6, 0.15),
    ]
    return rows


def print_anchor_table() -> None:
    print(f"{'anchor':52s} {'predicted':>12s} {'anchor':>12s} {'error':>7s}")
    for what, pred, ref, _tol in anchor_table():
        scale = 1e9 if "busbw" in what else 1e-6
        unit = "GB/s" if "busbw" in what else "us"
        print(f"{what:52s} {pred / scale:9.1f} {unit:>4s} {ref / scale:8.1f} {unit:>4s} {pred / ref - 1:+7.1%}")


@pytest.mark.parametrize("row", anchor_table(), ids=lambda r: r[0])
def test_anchor(row):
    what, pred, ref, tol = row
    assert abs(pred / ref - 1) <= tol, (what, pred, ref)


def test_algorithm_choice():
    h100 = get_network("h100-ib")
    pick = lambda **kw: collective_cost(network=h100, **kw).algorithm  # noqa: E731
    assert pick(kind="all_reduce", msg_bytes=GiB, group_size=8) == "nvls"  # NVSwitch domain
    assert pick(kind="all_reduce", msg_bytes=64 << 10, group_size=8) == "ring"  # NVLS's 25 us start-up
    assert pick(kind="all_reduce", msg_bytes=8, group_size=16) in ("tree", "hierarchical")
    # NVLink-bound ring (or tree, within 2% here) beats the sequential phases at large sizes
    assert pick(kind="all_reduce", msg_bytes=GiB, group_size=64) in ("ring", "tree")
    assert pick(kind="all_to_all", msg_bytes=GiB, group_size=64) == "pairwise"
    assert pick(kind="send_recv", msg_bytes=GiB, group_size=2) == "direct"
    # the lent box has no NVLS (NV18 direct links)
    assert collective_cost(kind="all_reduce", msg_bytes=GiB, group_size=2, network=LENT).algorithm == "ring"
    with pytest.raises(ValueError, match=r"^algorithm 'nvls' does not apply to all_reduce over 2 ranks"):
        collective_cost(kind="all_reduce", msg_bytes=GiB, group_size=2, network=LENT, algorithm="nvls")
    assert set(algorithms_for("all_reduce")) <= set(ALGORITHMS)


def test_auto_is_the_fastest_applicable():
    net = get_network("h100-roce-3tier")
    for kind in COLLECTIVE_KINDS:
        for m in (8, 64 << 10, 4 * MiB, GiB):
            for n, stride in ((8, 1), (16, 1), (64, 1), (8, 16), (256, 1)):
                best = collective_cost(kind=kind, msg_bytes=m, group_size=n, network=net, stride=stride)
                for alg in algorithms_for(kind):
                    try:
                        c = collective_cost(kind=kind, msg_bytes=m, group_size=n, network=net, stride=stride,
                                            algorithm=alg)
                    except ValueError:
                        continue
                    assert best.time_s <= c.time_s


def test_hierarchical_all_reduce_is_its_phases():
    net = get_network("h100-ib")
    m = 256 * MiB
    h = collective_cost(kind="all_reduce", msg_bytes=m, group_size=16, network=net, algorithm="hierarchical")
    rs = collective_cost(kind="reduce_scatter", msg_bytes=m, group_size=8, network=net, algorithm="ring")
    ar = collective_cost(kind="all_reduce", msg_bytes=m / 8, group_size=2, network=net, stride=8, algorithm="ring")
    ag = collective_cost(kind="all_gather", msg_bytes=m, group_size=8, network=net, algorithm="ring")
    assert h.transfer_s == pytest.approx(rs.transfer_s + ar.transfer_s + ag.transfer_s)
    assert h.tiers == ("nvlink", "leaf")


@pytest.mark.parametrize("kind", COLLECTIVE_KINDS)
def test_monotonic_in_message_size_and_zero_for_one_rank(kind):
    for net, n in (("h100-roce-3tier", 16), ("h200x2-nv18", 2), ("gb200-nvl72", 144)):
        network = get_network(net)
        sizes = [0, 1, 1024, MiB, 16 * MiB, 256 * MiB, GiB, 4 * GiB]
        times = [collective_time_s(kind=kind, msg_bytes=m, group_size=n, network=network) for m in sizes]
        assert times == sorted(times) and times[0] > 0, (net, times)
        assert collective_time_s(kind=kind, msg_bytes=GiB, group_size=1, network=network) == 0.0


def test_oversubscription_divides_bandwidth():
    net = get_network("h100-roce-3tier")
    cost = dict(kind="all_gather", msg_bytes=GiB, group_size=8, network=net, algorithm="ring")
    spine = collective_cost(**cost, stride=16)  # 8 racks of one pod: spine
    superspine = collective_cost(**cost, stride=3072)  # 8 pods: superspine at 1:7
    assert (spine.tiers, superspine.tiers) == (("spine",), ("superspine",))
    assert superspine.transfer_s == pytest.approx(7 * spine.transfer_s)


def test_imbalance_and_scale():
    kw = dict(kind="all_to_all", msg_bytes=64 * MiB, group_size=16, network=get_network("h100-ib"))
    base = collective_cost(**kw)
    skew = collective_cost(**kw, imbalance=1.5)
    assert skew.transfer_s == pytest.approx(1.5 * base.transfer_s) and skew.latency_s == base.latency_s
    assert collective_cost(**kw, scale=2.0).time_s == pytest.approx(2 * base.time_s)
    assert isinstance(base, CollectiveCost) and base.time_s == pytest.approx(base.latency_s + base.transfer_s)


def test_sm_counts_and_sm_free():
    h100 = get_network("h100-ib")
    c = lambda **kw: collective_cost(msg_bytes=64 * MiB, network=h100, **kw)  # noqa: E731
    assert c(kind="all_reduce", group_size=8, algorithm="ring").sms == 24
    assert c(kind="all_reduce", group_size=8).sms == 16  # NVLS channels
    assert c(kind="all_gather", group_size=16).sms == 16  # crosses the IB leaf
    assert c(kind="send_recv", group_size=2).sms == 8
    free = c(kind="all_gather", group_size=8, sm_free=True)
    assert (free.sms, free.algorithm) == (0, "copy_engine")  # NCCL 2.28
    assert free.time_s == c(kind="all_gather", group_size=8).time_s  # assumption: same speed
    cross = c(kind="all_to_all", group_size=64, sm_free=True)
    assert (cross.sms, cross.algorithm) == (0, "hierarchical_zero_sm")  # NCCL 2.30
    assert c(kind="all_reduce", group_size=8, sm_free=True).sms == 16  # reductions keep their SMs


def test_legacy_tier_keyword_and_helpers():
    nvlink, leaf = get_network("h100-ib").tiers[:2]
    assert collective_time_s(kind="all_gather", msg_bytes=GiB, group_size=4, tier=nvlink) > 0
    assert collective_sms(kind="all_gather", sm_free=True, tier=nvlink) == 0
    assert collective_sms(kind="all_to_all", sm_free=False, tier=leaf) == 16
    with pytest.raises(ValueError) as e:
        collective_sms(kind="all_reduce", sm_free=True, tier=nvlink)
    assert str(e.value) == ("sm_free all_reduce is not possible on tier 'nvlink' (nvlink): copy engines only do "
                            "all_gather, all_to_all inside an NVLink domain; set sm_free=False")


def test_bad_inputs():
    with pytest.raises(ValueError) as e:
        collective_time_s(kind="allreduce", msg_bytes=1, group_size=2, network=LENT)
    assert str(e.value) == ("unknown collective kind 'allreduce'; known: all_reduce, reduce_scatter, all_gather, "
                            "all_to_all, broadcast, send_recv")
    with pytest.raises(ValueError, match=r"^all_reduce: msg_bytes \(-1\) must be >= 0"):
        collective_time_s(kind="all_reduce", msg_bytes=-1, group_size=2, network=LENT)
    with pytest.raises(ValueError, match=r"^all_to_all: imbalance \(0.5\) must be >= 1"):
        collective_time_s(kind="all_to_all", msg_bytes=1, group_size=2, network=LENT, imbalance=0.5)
    with pytest.raises(ValueError, match=r"^algorithm 'bruck' unknown"):
        collective_time_s(kind="all_to_all", msg_bytes=1, group_size=2, network=LENT, algorithm="bruck")
    with pytest.raises(ValueError, match=r"^group of 4 ranks at stride 1 spans 4 GPUs"):
        collective_time_s(kind="all_to_all", msg_bytes=1, group_size=4, network=LENT)


if __name__ == "__main__":
    print_anchor_table()


def test_all_to_all_pays_each_peer_and_sends_per_peer_messages():
    """NCCL's all-to-all is n-1 send/recv pairs of m/n bytes: each peer costs its tier's step
    latency, and each message reaches the efficiency of m/n bytes, not of m."""
    net = get_network("gb200-nvl72")  # 72 GPUs on one NVLink domain
    nv = net.tiers[0]
    cost = lambda n, m: collective_cost(kind="all_to_all", msg_bytes=m, group_size=n, network=net)  # noqa: E731
    assert cost(64, 8).latency_s - cost(8, 8).latency_s == pytest.approx(56 * nv.latency_s)
    assert cost(8, 8).latency_s == pytest.approx(nv.base_latency_s + 7 * nv.latency_s)
    m, n = 64 * MiB, 8
    per = m / n
    eff = max(nv.ll_efficiency, nv.efficiency * per / (per + nv.half_eff_bytes))
    assert cost(n, m).transfer_s == pytest.approx((n - 1) * per / (nv.bw_per_gpu_Bps * eff))
    busbw = [16 * MiB / cost(k, 16 * MiB).time_s * bus_factor("all_to_all", k) for k in (8, 16, 32, 64)]
    assert busbw == sorted(busbw, reverse=True)  # smaller messages per peer, more peers: slower
