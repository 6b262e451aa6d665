import networkx as nx
import pytest

from hwmodels import build_graph, get_network, list_networks
from hwmodels.network import NetworkPreset


def test_presets():
    assert list_networks() == ["b200-ib", "cpu-host", "cpu-host-8", "dgx-a100-hdr", "gb200-nvl72", "h100-ib",
                               "h100-roce-3tier", "h200-ib", "h200x2-nv18", "h200x8-nvswitch", "p4d-efa", "xe8545-a100"]


@pytest.mark.parametrize("name", ["b200-ib", "cpu-host", "cpu-host-8", "dgx-a100-hdr", "gb200-nvl72", "h100-ib",
                                  "h100-roce-3tier", "h200-ib", "h200x2-nv18", "h200x8-nvswitch", "p4d-efa", "xe8545-a100"])
def test_every_tier_cites_resolvable_sources(name):
    preset = get_network(name)
    for tier in preset.tiers:
        assert tier.sources and all(len(preset.sources[s]) > 10 for s in tier.sources)


def test_a_former_preset_name_still_loads():
    from twin.runrecord import load_run

    assert get_network("lent-h200x2") is get_network("h200x2-nv18")
    from pathlib import Path

    runs = Path(__file__).resolve().parents[2] / "hwmodels" / "data" / "runs"
    record = load_run(runs / "h200-2026-11-30-roundtrip" / "h200-gem-1gpu.json")  # written under the old name
    assert record.scenario["hardware"]["network"] == "lent-h200x2"
    from twin.calibrate import compare

    assert compare(record, None).result.network == "h200x2-nv18"


def test_unknown_preset_message():
    with pytest.raises(ValueError) as e:
        get_network("h100-eth")
    assert str(e.value) == ("unknown network preset 'h100-eth'; known: b200-ib, cpu-host, cpu-host-8, dgx-a100-hdr, "
                            "gb200-nvl72, h100-ib, h100-roce-3tier, h200-ib, h200x2-nv18, h200x8-nvswitch, p4d-efa, "
                            "xe8545-a100")


@pytest.mark.parametrize(("group_size", "stride", "tier"), [
    (1, 1, "nvlink"),        # one rank: innermost
    (8, 1, "nvlink"),        # a whole HGX node
    (9, 1, "leaf"),          # one rank past the node
    (2, 8, "leaf"),          # ranks 0 and 8: two nodes of one rack
    (2, 4, "nvlink"),        # ranks 0 and 4: same node
    (16, 1, "leaf"),         # the 16-GPU rack
    (2, 16, "spine"),        # two racks
    (192, 16, "spine"),      # one GPU per rack across a pod: span 3,057 <= 3,072
    (193, 16, "superspine"),
    (8, 3072, "superspine"), # one GPU per pod
    (24576, 1, "superspine"),
])
def test_tier_for_group_roce(group_size, stride, tier):
    preset = get_network("h100-roce-3tier")
    assert preset.tier_for_group(group_size=group_size, stride=stride).name == tier


def test_tier_for_group_nvl72():
    preset = get_network("gb200-nvl72")
    assert preset.tier_for_group(group_size=72).name == "nvlink"
    assert preset.tier_for_group(group_size=8, stride=9).name == "nvlink"  # span 64
    assert preset.tier_for_group(group_size=2, stride=72).name == "leaf"


def test_tier_for_group_errors():
    preset = get_network("h200x2-nv18")
    with pytest.raises(ValueError) as e:
        preset.tier_for_group(group_size=4)
    assert str(e.value) == ("group of 4 ranks at stride 1 spans 4 GPUs, more than network 'h200x2-nv18' holds (2); "
                            "shrink the group or pick a larger preset")
    with pytest.raises(ValueError, match=r"^tier_for_group: group_size \(0\) and stride \(1\) must be >= 1$"):
        preset.tier_for_group(group_size=0)


def test_domains_must_nest():
    tier = get_network("h100-ib").tiers[0].model_dump()
    outer = {**tier, "name": "leaf", "domain_gpus": 12}
    with pytest.raises(ValueError, match="tier 'leaf' domain_gpus \\(12\\) must be a larger multiple of tier 'nvlink' \\(8\\)"):
        NetworkPreset(name="bad", description="", tiers=[tier, outer], sources={s: "x" for s in tier["sources"]})


def test_build_graph_is_a_tree_with_aggregated_bandwidth():
    g = build_graph(get_network("h100-roce-3tier"), 40)
    assert nx.is_tree(g)
    assert sum(1 for _, d in g.nodes(data=True) if d["kind"] == "gpu") == 40
    switches = sorted(n for n, d in g.nodes(data=True) if d["kind"] == "switch")
    assert switches == ["leaf0", "leaf1", "leaf2", "nvlink0", "nvlink1", "nvlink2", "nvlink3", "nvlink4", "spine0"]
    assert g.edges["gpu0", "nvlink0"]["bw_Bps"] == 450e9
    assert g.edges["nvlink0", "leaf0"]["bw_Bps"] == 8 * 50e9
    assert nx.shortest_path_length(g, "gpu0", "gpu39") == 6  # gpu-nvlink-leaf-spine-leaf-nvlink-gpu


def test_build_graph_limits():
    assert build_graph(get_network("h200x2-nv18"), 2).number_of_edges() == 2
    with pytest.raises(ValueError, match=r"^build_graph: n_gpus \(5000\) must be in 1\.\.4096"):
        build_graph(get_network("h100-ib"), 5000)


@pytest.mark.parametrize(("group_size", "stride", "levels", "bottleneck_GBps"), [
    (1, 1, [], 0.0),
    (8, 1, [("nvlink", 8, 1)], 364.5),               # one node: NVLink x 0.81
    (2, 8, [("leaf", 2, 1)], 48.0),                   # one GPU per node: its own 400G NIC x 0.96
    (16, 1, [("nvlink", 8, 1), ("leaf", 2, 8)], 364.5),  # 2 nodes: 8 NICs in parallel, NVLink binds
    (32, 8, [("leaf", 32, 1)], 48.0),                 # 32 nodes, one GPU each
    (512, 1, [("nvlink", 8, 1), ("leaf", 32, 8), ("spine", 2, 256)], 364.5),
])
def test_group_levels_and_bottleneck(group_size, stride, levels, bottleneck_GBps):
    preset = get_network("h100-ib")
    got = preset.group_levels(group_size=group_size, stride=stride)
    assert [(lv.tier.name, lv.members, lv.ranks_per_member) for lv in got] == levels
    assert preset.bottleneck_bw_Bps(group_size=group_size, stride=stride) == pytest.approx(bottleneck_GBps * 1e9)


def test_bottleneck_sees_oversubscription():
    preset = get_network("h100-roce-3tier")
    # one GPU per pod across 8 pods: superspine at 1:7, 50 GB/s x 0.92 / 7
    assert preset.bottleneck_bw_Bps(group_size=8, stride=3072) == pytest.approx(50e9 * 0.92 / 7)
