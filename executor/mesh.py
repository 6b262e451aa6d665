"""The device mesh of a run: one world of ranks, seen along the five named axes.

The five axes (``scenarios.vocab.MeshAxis``) are not five dims of one grid: dense HSDP
(``dense_replicate × dense_shard``), expert parallelism (``expert_replicate × expert``) and 2D
embedding parallelism (``sparse_replica × sparse_shard``) each factor the *whole* world, in
their own way. So, as torchtitan's ``ParallelDims`` does, the run builds one 1-D world mesh and
unflattens it into three 2-D views, one per factorisation; ``mesh["dense_shard"]`` is the 1-D
sub-mesh of any axis, whichever view holds it. The derived group ``sparse_world`` (every rank:
the tables' hot rows, ``executor.hot_rows``) is the world mesh itself.

Each view's rank order is the one ``scenarios.placement.axis_group`` declares for the twin: the
inner axis (``dense_shard``, ``expert``, ``sparse_shard``) is consecutive ranks (stride 1, so it
stays inside a node when it fits), the outer one strides by the inner size. A row-major unflatten
of ``arange(world)`` is exactly that.

``check_world`` is torch.distributed-free: the launcher calls it before any process group starts.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from scenarios.messages import count
from scenarios.placement import axis_group
from scenarios.schema import Scenario
from scenarios.vocab import CommGroup

# each view: (outer axis, inner axis); the inner axis has stride 1
VIEWS: dict[str, tuple[CommGroup, CommGroup]] = {
    "dense": (CommGroup.DENSE_REPLICATE, CommGroup.DENSE_SHARD),
    "expert": (CommGroup.EXPERT_REPLICATE, CommGroup.EXPERT),
    "sparse": (CommGroup.SPARSE_REPLICA, CommGroup.SPARSE_SHARD),
}


def check_world(scenario: Scenario, world_size: int) -> None:
    """One-line ``ValueError`` when ``scenario`` cannot run on ``world_size`` ranks. The Scenario
    itself already holds each view's degrees to multiply up to ``hardware.num_gpus`` (and
    ``expert`` to divide it), so the world only has to be that many ranks."""
    n = scenario.hardware.num_gpus
    if world_size < 1:
        raise ValueError(f"world size ({world_size}) must be at least 1 rank; launch with --nproc 1 or more")
    if world_size != n:
        raise ValueError(
            f"hardware.num_gpus ({n}) must equal the world size ({world_size}): launch {count(n, 'rank')} "
            f"(--nproc {n}) or set hardware.num_gpus={world_size} and parallelism degrees whose products "
            f"are {world_size} (dense_replicate × dense_shard, sparse_replica × sparse_shard)"
        )


def view_shapes(scenario: Scenario) -> dict[str, tuple[int, int]]:
    """Each view's (outer, inner) sizes, from the placement's own axis groups."""
    return {view: (axis_group(scenario, outer)[0], axis_group(scenario, inner)[0])
            for view, (outer, inner) in VIEWS.items()}  # fmt: skip


@dataclass(frozen=True)
class Mesh:
    """The world mesh and its three 2-D views; index it by any axis name for a 1-D sub-mesh."""

    world: object  # DeviceMesh, 1-D, named "world"
    views: dict[str, object]  # "dense" | "expert" | "sparse" -> 2-D DeviceMesh

    def __getitem__(self, axis: str):
        if axis == CommGroup.SPARSE_WORLD:  # sparse_replica × sparse_shard, flattened: the world
            return self.world
        for view, axes in VIEWS.items():
            if axis in axes:
                return self.views[view][str(axis)]
        raise KeyError(f"mesh axis '{axis}': use one of {', '.join(a for axes in VIEWS.values() for a in axes)}")

    @property
    def dense(self):
        """The (dense_replicate, dense_shard) view: FSDP2's HSDP mesh."""
        return self.views["dense"]

    def sizes(self) -> dict[str, int]:
        """Every axis's size (the RunRecord's ``mesh``), world included (``sparse_world`` is the world)."""
        out = {"world": self.world.size()}
        for view, axes in VIEWS.items():
            out.update({str(a): int(n) for a, n in zip(axes, self.views[view].shape)})
        return out


def build_mesh(scenario: Scenario, device: torch.device) -> Mesh:
    """The run's mesh over the initialised default process group (world size checked first).

    ``DeviceMesh._unflatten`` (torch 2.13) makes each view from the one world mesh; where it is
    missing (older torch), each view is its own ``init_device_mesh`` of the same rank order."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    world_size = dist.get_world_size()
    check_world(scenario, world_size)
    world = init_device_mesh(device.type, (world_size,), mesh_dim_names=("world",))
    views = {}
    for view, shape in view_shapes(scenario).items():
        names = tuple(str(a) for a in VIEWS[view])
        if hasattr(world, "_unflatten"):
            views[view] = world._unflatten(0, shape, names)
        else:
            views[view] = init_device_mesh(device.type, shape, mesh_dim_names=names)
    return Mesh(world, views)


@dataclass(frozen=True)
class Ranks:
    """This process's place in a multi-rank run, and the few collectives the loop itself issues
    (the loss, the held-out set's outputs, the per-rank measurements), all over the world."""

    rank: int
    size: int
    mesh: Mesh
    collective_path: str = ""  # gloo | nccl | nccl-zero-cta (executor.collectives)

    def mean(self, t: torch.Tensor) -> torch.Tensor:
        """``t`` averaged over the ranks (sum, then divide: gloo has no average)."""
        import torch.distributed as dist

        t = t.detach().clone()
        dist.all_reduce(t, group=self.mesh.world.get_group())
        return t / self.size

    def cat(self, t: torch.Tensor) -> torch.Tensor:
        """Every rank's ``t`` (equal shapes), concatenated in rank order along dim 0."""
        import torch.distributed as dist

        parts = [torch.empty_like(t) for _ in range(self.size)]
        dist.all_gather(parts, t.contiguous(), group=self.mesh.world.get_group())
        return torch.cat(parts)


def ranks_of(scenario: Scenario, device: torch.device) -> Ranks | None:
    """The run's ranks over the default process group the launcher started (``executor.launch``),
    its mesh built; None without one, or with one rank: a single-process run issues no collective."""
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_initialized() or dist.get_world_size() == 1:
        return None
    from executor.collectives import collective_path

    return Ranks(dist.get_rank(), dist.get_world_size(), build_mesh(scenario, device),
                 collective_path(scenario, dist.get_backend()))  # fmt: skip
