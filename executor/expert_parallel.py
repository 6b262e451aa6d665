"""Expert parallelism over the mesh's ``expert`` axis, and FSDP2 of each rank's experts over
``expert_replicate``, as torchtitan lays out MoE (``parallelize_deepseekv3``/``apply_moe_ep_tp``).

With ``parallelism.expert`` = EP > 1, every MoE layer keeps ``E/EP`` of its ``E`` experts: the
rank at position ``pos`` of its ``expert`` group holds experts ``[pos·E/EP, (pos+1)·E/EP)``. Its
tokens reach their experts by one all-to-all of a capacity-padded buffer and come back by
another (``executor.moe``: ``MoE.capacity_factor`` set to ``model.moe.capacity_factor``; what
overflows an expert's capacity is dropped and counted).

The ranks that hold the same experts (one per ``expert`` group: the ``expert_replicate`` axis,
``world/EP`` ranks) shard them with FSDP2, one unit per layer's ``GroupedExperts``. The gradient
math: the reference gradient is the mean over every rank's loss, ``(1/W) Σ_r ∇L_r``. An expert's
owner already gets ``Σ`` over its ``expert`` group's losses from the all-to-all's backward (each
source rank's tokens' gradients come back to it); FSDP2 sums that over ``expert_replicate``, so
the whole world is summed once, and the divide factor is the world size ``W``, not FSDP's
default (its own mesh's size, ``W/EP``).
"""

from __future__ import annotations

from torch import nn

from executor.collectives import fsdp_symmetric_buffers
from executor.mesh import Mesh
from executor.moe import MoE
from executor.optim import DisjointParams
from scenarios.schema import Scenario


def shard_experts(model: nn.Module, scenario: Scenario, mesh: Mesh) -> DisjointParams | None:
    """Expert parallelism in place (see the module docstring); returns the expert parameters it
    took over (FSDP2 DTensors over ``expert_replicate``, which the dense FSDP2 units must ignore)
    with the ``expert`` group over which each rank holds different ones (the gradient norm sums
    over it). With ``parallelism.expert`` 1 it does nothing and returns None: the experts stay
    whole and replicated (``executor.replicated``)."""
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard

    from executor.parallelize import mixed_precision

    p = scenario.parallelism
    moes = [m for m in model.modules() if isinstance(m, MoE)]
    if p.expert == 1 or not moes:
        return None
    expert, replicate = mesh["expert"], mesh["expert_replicate"]
    group, pos, world = expert.get_group(), expert.get_local_rank(), mesh.world.size()
    policy = mixed_precision(scenario.precision, mesh.world.device_type)
    out = []
    for moe in moes:
        local = moe.num_experts // p.expert
        moe.experts.keep(pos * local, local)
        moe.group, moe.capacity_factor = group, scenario.model.moe.capacity_factor
        unit = fully_shard(moe.experts, mesh=replicate, mp_policy=policy,
                           reshard_after_forward=p.fsdp_reshard_after_forward)  # fmt: skip
        unit.set_gradient_divide_factor(world)
        fsdp_symmetric_buffers(unit, scenario, dist.get_backend(replicate.get_group()))
        if replicate.size() > 1 and dist.get_backend(replicate.get_group()) == "gloo":
            # a divide factor other than the mesh's size is a PREMUL_SUM reduce-scatter (NCCL's),
            # which gloo lacks: sum, then divide. (On a 1-rank mesh FSDP2 divides in its copy
            # already, and forcing the sum would divide a second time: torch 2.13,
            # fsdp/_fully_shard/_fsdp_collectives.py foreach_reduce.)
            unit.set_force_sum_reduction_for_comms(True)
        out += list(moe.experts.parameters())
    return DisjointParams(out, group)
