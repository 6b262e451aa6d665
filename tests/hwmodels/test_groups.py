"""Group shapes on the tiers (hwmodels.groups): misaligned splits, straddling groups, congestion."""

from __future__ import annotations

import numpy as np
import pytest

from hwmodels.collectives import collective_cost
from hwmodels.groups import _enumerate, axis_layout, rank0_shape
from hwmodels.network import get_network

MiB = 1 << 20


@pytest.mark.parametrize(("net", "size", "stride"), [
    ("h100-ib", 8, 1), ("h100-ib", 16, 1), ("h100-ib", 512, 1), ("h100-ib", 2, 8), ("h100-ib", 32, 8),
    ("h100-roce-3tier", 8, 3072), ("h100-roce-3tier", 16, 1), ("h100-roce-3tier", 192, 16),
    ("gb200-nvl72", 144, 1), ("gb200-nvl72", 8, 9),
])  # fmt: skip
def test_aligned_groups_keep_the_aligned_levels(net, size, stride):
    """Where the aligned assumption holds, the exact geometry gives NetworkPreset.group_levels'
    levels, every member reaching ranks - inside peers through a tier, uplinks counted full."""
    preset = get_network(net)
    shape = rank0_shape(preset, size=size, stride=stride)
    aligned = preset.group_levels(group_size=size, stride=stride)
    assert [(preset.tiers[lv.tier].name, lv.members, lv.ranks_per_member) for lv in shape.levels] == \
        [(lv.tier.name, lv.members, lv.ranks_per_member) for lv in aligned]  # fmt: skip
    inside = 1
    for lv in shape.levels:
        assert lv.far == inside * lv.members - inside
        assert lv.congestion == lv.ring_congestion == preset.tiers[lv.tier].oversubscription
        inside *= lv.members
    assert shape.even


def test_twelve_on_eight_gpu_nodes_split_eight_plus_four():
    """sparse_shard 12 on 8-GPU nodes: groups 0-11 split 8+4, 12-23 4+8, ...: one shape for all
    of them, whose leaf crossing has 4 links in parallel (not 8) and whose 4-side members send
    8/12 of their data through their NIC (not 4/12); no hierarchical algorithm (uneven)."""
    net = get_network("h100-ib")
    layout = axis_layout(net, size=12, stride=1, num_gpus=96)
    assert layout.rank_shape is None and len(layout.shapes) == 1
    (shape,) = layout.shapes
    nvlink, leaf = shape.levels
    assert (nvlink.members, nvlink.far, nvlink.inner, nvlink.outer) == (8, 7, 12, 2)
    assert (leaf.members, leaf.ranks_per_member, leaf.far, leaf.inner, leaf.outer) == (2, 4, 8, 2, 1)
    assert not shape.even
    m = 256 * MiB
    c = collective_cost(kind="all_to_all", msg_bytes=m, group_size=12, network=net, shape=shape)
    nic = net.tiers[1].bw_per_gpu_Bps * net.tiers[1].efficiency * (m / 12) / (m / 12 + net.tiers[1].half_eff_bytes)
    assert c.transfer_s == pytest.approx(8 * (m / 12) / nic)
    with pytest.raises(ValueError, match=r"^algorithm 'hierarchical' does not apply to all_reduce over 12 ranks"):
        collective_cost(kind="all_reduce", msg_bytes=m, group_size=12, network=net, shape=shape,
                        algorithm="hierarchical")  # fmt: skip


def test_groups_that_straddle_a_leaf_boundary_get_their_own_shape():
    """12-rank groups on 16-GPU racks: groups 0 and 3 of every 48 ranks stay in one rack (leaf),
    groups 1 and 2 straddle two racks (spine)."""
    net = get_network("h100-roce-3tier")
    layout = axis_layout(net, size=12, stride=1, num_gpus=96)
    leaf, spine = layout.shapes
    assert [net.tiers[lv.tier].name for lv in leaf.levels] == ["nvlink", "leaf"]
    assert [net.tiers[lv.tier].name for lv in spine.levels] == ["nvlink", "spine"]
    pattern = np.repeat([0, 1, 1, 0], 12)
    assert layout.rank_shape.tolist() == np.tile(pattern, 2).tolist()


@pytest.mark.parametrize(("net", "size", "stride", "gpus"), [
    ("h100-ib", 8, 1, 64), ("h100-ib", 16, 1, 512), ("h100-ib", 32, 8, 1024), ("h100-roce-3tier", 4, 8, 6144),
    ("h100-roce-3tier", 8, 768, 6144), ("gb200-nvl72", 8, 9, 144), ("gb200-nvl72", 576, 1, 1152),
])  # fmt: skip
def test_the_aligned_shortcut_agrees_with_enumerating_every_group(net, size, stride, gpus):
    preset = get_network(net)
    fast = axis_layout(preset, size=size, stride=stride, num_gpus=gpus)
    assert fast.rank_shape is None
    assert _enumerate(preset, size, stride, gpus).shapes == fast.shapes


def test_congestion_counts_the_links_through_an_oversubscribed_uplink():
    """3,200 GPUs on the 1:7 superspine of h100-roce-3tier (3,072-GPU pods). sparse_shard 40: only
    group 76 (ranks 3040-3079) straddles the pods; 32 GPUs of pod 0 use its uplink, which it then
    has to itself (congestion 1, not 7). sparse_replica 80 at stride 40: every group crosses; an
    all-to-all puts every GPU of pod 0 on the uplink (7), a ring only each group's 3 or 4 links
    (40 groups: 32 x 3 + 8 x 4 = 128 of 3,072: no congestion)."""
    net = get_network("h100-roce-3tier")
    shard = axis_layout(net, size=40, stride=1, num_gpus=3200)
    straddler = shard.shapes[shard.rank_shape[3040]]
    (top,) = [lv for lv in straddler.levels if net.tiers[lv.tier].name == "superspine"]
    assert (top.congestion, top.ring_congestion) == (1.0, 1.0)
    assert int((shard.rank_shape == shard.rank_shape[3040]).sum()) == 40
    replica = axis_layout(net, size=80, stride=40, num_gpus=3200)
    for shape in replica.shapes:
        (top,) = [lv for lv in shape.levels if net.tiers[lv.tier].name == "superspine"]
        assert top.congestion == 7.0 and top.ring_congestion == 1.0
        assert top.ranks_per_member in (3, 4)


def test_congestion_slows_only_what_fills_the_uplink():
    """The straddling group's all-to-all runs at the NIC's rate; priced as rank 0's group with
    every uplink full (the bare call's assumption) its superspine bytes would take 7x longer."""
    net = get_network("h100-roce-3tier")
    shard = axis_layout(net, size=40, stride=1, num_gpus=3200)
    shape = shard.shapes[shard.rank_shape[3040]]
    full = shape._replace(levels=tuple(lv._replace(congestion=net.tiers[lv.tier].oversubscription)
                                       for lv in shape.levels))  # fmt: skip
    m = 1 << 30
    free = collective_cost(kind="all_to_all", msg_bytes=m, group_size=40, network=net, shape=shape)
    jammed = collective_cost(kind="all_to_all", msg_bytes=m, group_size=40, network=net, shape=full)
    assert jammed.transfer_s == pytest.approx(7 * free.transfer_s)


def test_layout_errors_name_the_field_and_the_fix():
    net = get_network("h100-ib")
    with pytest.raises(ValueError) as e:
        axis_layout(net, size=12, stride=1, num_gpus=100)
    assert str(e.value) == ("axis_layout: num_gpus (100) must be a multiple of size (12) × stride (1); "
                            "fix the mesh degrees")
    shape = axis_layout(net, size=12, stride=1, num_gpus=96).shapes[0]
    with pytest.raises(ValueError) as e:
        collective_cost(kind="all_to_all", msg_bytes=MiB, group_size=8, network=net, shape=shape)
    assert str(e.value) == ("shape: its size (12) must equal group_size (8); pass the shape "
                            "hwmodels.groups.axis_layout gives for this group")
