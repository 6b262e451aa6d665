"""Every mesh axis at once: 8 ranks on gloo train what one process trains.

The bundled ``debug-cpu-5d`` layout (HSDP 2 × 4 for the dense parameters, experts over 4 with 2
replicas of each slice under FSDP2, the tables over ``sparse_shard`` 4 by the twin's ``auto``
plan and fully sharded over 2 replicas) at the tiny test sizes, one micro-batch of 16 a rank,
against one process that trains the same 8 micro-batches a step and applies the experts' capacity
to each of them as the expert ranks do (``executor.moe.set_capacity``): losses, dense weights,
experts (gathered into the one-process layout), tables (rebuilt whole), the clip norms and the
dropped assignments must match. One launch of 8 ranks (~16 s of imports on the 2-core machine,
more under load).
"""

from __future__ import annotations

import time

import pytest
import torch

import scenarios
from executor import launch
from test_distributed import EXACT, STEPS, TINY, _check_record, _kinds, _parity, _rel
from test_expert_parallel import _ep_rank, _gathered, _train_clipped
from twin.runrecord import load_run

SETS = [*TINY, "training.micro_batch=16"]
ONE = ["hardware.num_gpus=1", *(f"parallelism.{a}=1" for a in ("dense_replicate", "dense_shard", "expert",
                                                               "sparse_shard", "sparse_replica"))]  # fmt: skip
DENSE_ONE = 2e-4
AXES = ("dense_replicate", "dense_shard", "expert", "expert_replicate", "sparse_shard", "sparse_replica")


def test_every_axis_at_once_on_eight_ranks_matches_one_process(tmp_path):
    five = scenarios.load("debug-cpu-5d", SETS)
    assert all(axis > 1 for axis in (five.parallelism.dense_replicate, five.parallelism.dense_shard,
                                     five.parallelism.expert, five.parallelism.sparse_shard,
                                     five.parallelism.sparse_replica))  # fmt: skip
    factor = five.model.moe.capacity_factor
    ref_record, ref_w, _, ref_norms = _train_clipped(scenarios.load("debug-cpu-5d", SETS + ONE), capacity_factor=factor)
    start = time.perf_counter()
    results = launch.launch_local(_ep_rank, ([five], str(tmp_path)), 8, timeout_s=300)
    wall = time.perf_counter() - start
    weights = _gathered(results, 0, five.parallelism.expert)
    # one parameter per worst case: cross_layers.0.s_ln_q.bias, whose gradient is a sum of terms that
    # nearly cancel (its norm 10-20x the other LayerNorm biases' smaller), ends 8.6e-5 apart after 3
    # AdamW steps, every other dense parameter within 6e-7: each one is held to DENSE_ONE, all of them
    # together (one vector) to EXACT
    kinds = _kinds(five)
    got = _parity((ref_record, ref_w), dict(record=results[0]["runs"][0]["record"], weights=weights), kinds,
                  dict(EXACT, dense=DENSE_ONE))  # fmt: skip
    dense = [n for n in ref_w if kinds[n] != "sparse"]
    bulk = _rel(torch.cat([weights[n].reshape(-1) for n in dense]), torch.cat([ref_w[n].reshape(-1) for n in dense]))
    assert bulk < EXACT["dense"], bulk
    experts = max(_rel(weights[n], ref_w[n]) for n in ref_w if ".moe.experts." in n)
    assert experts < EXACT["dense"], experts
    norms = max(abs(a - b) / b for r in results.values() for a, b in zip(r["runs"][0]["norms"], ref_norms))
    assert norms < 1e-5 and len(ref_norms) == STEPS
    record = load_run(tmp_path / "case0.json")
    _check_record(record, results, 0, 8)
    assert all(record.mesh[a] == 2 if a in ("dense_replicate", "expert_replicate", "sparse_replica") else
               record.mesh[a] == 4 for a in AXES)  # fmt: skip
    assert record.moe_routed_assignments == ref_record.moe_routed_assignments > 0
    assert record.moe_dropped_assignments == ref_record.moe_dropped_assignments
    assert set(AXES) <= set(record.comm_s_by_axis), record.comm_s_by_axis  # every axis's collectives, profiled
    print(f"\nworld 8, every axis: parity {got}, dense as one vector {bulk:.2g}, experts {experts:.2g}, clip norm {norms:.2g}, dropped "
          f"{record.moe_dropped_assignments} of {record.moe_routed_assignments}; comm per axis "
          f"{ {a: round(s * 1e3, 1) for a, s in record.comm_s_by_axis.items()} } ms; launch {wall:.1f} s")
