"""DESIGN rule 3: the twin's op graph and the executor's model list the same layers, shapes and
collectives, for every bundled scenario (and variants that take the other branches).

The meeting point is the placement data (``scenarios.placement``): each ``LayerPlacement`` names
a layer of the twin (the ops' first name part) and the executor's parameters that hold its
weights (``Params.fqns``, prefixes of ``named_parameters()``, the longest naming a parameter
claims it). The executor's model is built under ``torch.device("meta")``, so the Meta-scale
scenarios' trillions of embedding parameters allocate nothing.

Shapes are compared as multisets with each shape's dims sorted: the twin records a weight as its
matmul uses it (``[k, n]``), an ``nn.Linear`` stores ``[n, k]``; the sizes are what both count.
"""

from __future__ import annotations

from collections import Counter
from functools import cache

import pytest
import torch

import scenarios
from executor.embeddings import PooledTables, SequenceGroupTokens
from executor.model import CrossLayer, DLRMModule, GEMModule, NonSequenceLayer, SequenceLayer, build_model
from executor.moe import MoE
from executor.parallelize import claim_parameters
from scenarios.placement import GATHERED, REDUCED, LayerPlacement, Payload, axis_group, placements
from scenarios.vocab import CommGroup, LayerKind, OpClass, ParamKind, Phase
from twin.flops import OpCost, model_costs
from twin.workload import COMPUTE, Hardware, _expert_params, _group_layers, build_graph

VARIANTS = {  # name -> (bundled scenario, overrides): the branches the bundled ones do not take
    "dlrm-dot": ("dlrm-dcnv2", ["model.interaction=dot"]),
    "debug-cpu-no-moe": ("debug-cpu", ["model.moe.num_experts=0"]),
    "gem-h200-2gpu-replicated-sync": ("gem-h200-2gpu", ["parallelism.sparse_strategy=replicated_sync",
                                                        "parallelism.sparse_sync_interval=10"]),
    "gem-h200-2gpu-accum": ("gem-h200-2gpu", ["training.global_batch=1024"]),
    "dlrm-hot-rows": ("dlrm-dcnv2", ["model.embeddings.pooled.0.hot_rows=200000",  # c0 table-, c20 row-wise
                                     "model.embeddings.pooled.20.hot_rows=200000"]),
    "gem-h200-2gpu-hot-rows": ("gem-h200-2gpu", ["model.embeddings.pooled.0.hot_rows=10000",
                                                 "model.embeddings.sequences.0.tables.0.hot_rows=10000"]),
}
CASES = [*scenarios.bundled(), *VARIANTS]


@cache
def _scenario(case: str) -> scenarios.Scenario:
    ref, sets = VARIANTS.get(case, (case, []))
    return scenarios.load(ref, sets)


@cache
def _executor(case: str) -> GEMModule | DLRMModule:
    with torch.device("meta"):
        return build_model(_scenario(case))


def _twin_layers(case: str) -> dict[str, list[OpCost]]:
    s = _scenario(case)
    return dict(_group_layers(model_costs(s.model, batch=s.training.micro_batch, precision=s.precision)))


def _claims(model: torch.nn.Module, layers: list[LayerPlacement]) -> dict[tuple[str, ParamKind], list[tuple]]:
    """Each executor parameter's shape under the (layer, kind) whose longest prefix names it
    (what ``parallelize.apply_sharding`` hands the sharding step)."""
    shapes = dict((n, tuple(p.shape)) for n, p in model.named_parameters())
    return {(layer, kind): [shapes[n] for n in names]
            for layer, kinds in claim_parameters(model, layers).items() for kind, names in kinds.items()}  # fmt: skip


def _twin_shapes(ops: list[OpCost], kind: ParamKind) -> list[tuple]:
    if kind is ParamKind.SPARSE:
        return [s for c in ops for s in c.sparse_shapes]
    experts = kind is ParamKind.EXPERT
    return [s for c in ops if c.op_class != OpClass.EMBEDDING and _expert_params(c) == experts
            for s in c.param_shapes]  # fmt: skip


def _multiset(shapes: list[tuple]) -> Counter:
    return Counter(tuple(sorted(s)) for s in shapes)


def test_executor_builds_on_meta_for_every_scenario():
    for case in CASES:
        model = _executor(case)
        assert {p.device.type for p in model.parameters()} == {"meta"}, case
    assert sum(p.numel() for p in _executor("gem-b200-8k").parameters()) > 1e12  # trillions, none allocated


@pytest.mark.parametrize("case", CASES)
def test_same_layers_in_the_same_order(case):
    """The placement's layers are the twin's FSDP units (lookups first) and its graph's layers."""
    s = _scenario(case)
    names = [lp.layer for lp in placements(s)]
    assert names == list(_twin_layers(case)), case
    graph = build_graph(s, Hardware.of(s))
    in_graph = dict.fromkeys(op.layer for op in graph if op.stream == COMPUTE and op.phase == Phase.FWD)
    assert list(in_graph) == names


_MODULE_OF_KIND = {LayerKind.SEQUENCE: SequenceLayer, LayerKind.NONSEQUENCE: NonSequenceLayer,
                   LayerKind.CROSS: CrossLayer}  # fmt: skip
_TABLE_OWNERS = (PooledTables, SequenceGroupTokens)


@pytest.mark.parametrize("case", CASES)
def test_layer_kinds_are_the_executor_modules(case):
    """Each placement names modules of its kind: a sequence layer a SequenceLayer, the tables the
    table modules' ``tables``, the experts a MoE's ``experts``; as many of each as the model has."""
    model, layers = _executor(case), placements(_scenario(case))
    for lp in layers:
        for p in lp.params:
            for fqn in p.fqns:
                owner = _module_or_parent(model, fqn)
                if lp.kind in _MODULE_OF_KIND and p.kind is ParamKind.DENSE:
                    assert isinstance(owner, _MODULE_OF_KIND[lp.kind]), (lp.layer, fqn, type(owner))
                if p.kind is ParamKind.SPARSE:
                    assert isinstance(_parent(model, fqn), _TABLE_OWNERS), (lp.layer, fqn)
                if p.kind is ParamKind.EXPERT:
                    assert isinstance(_parent(model, fqn), MoE), (lp.layer, fqn)
    kinds = Counter(lp.kind for lp in layers)
    for kind, cls in _MODULE_OF_KIND.items():
        assert kinds[kind] == sum(isinstance(m, cls) for m in model.modules()), (case, kind)


def _module_or_parent(model: torch.nn.Module, fqn: str) -> torch.nn.Module:
    try:
        return model.get_submodule(fqn)
    except AttributeError:  # a bare parameter (GEM's W_in): its module
        return _parent(model, fqn)


def _parent(model: torch.nn.Module, fqn: str) -> torch.nn.Module:
    return model.get_submodule(fqn.rpartition(".")[0])


@pytest.mark.parametrize("case", CASES)
def test_same_parameter_shapes(case):
    """Per layer and parameter kind, the executor's parameter shapes are the twin's (dense,
    experts, tables), and every executor parameter is some layer's."""
    s, model, twin = _scenario(case), _executor(case), _twin_layers(case)
    claims = _claims(model, placements(s))
    for (layer, kind), shapes in claims.items():
        want = _twin_shapes(twin[layer], kind)
        assert want, f"{case}: the twin has no {kind} parameters in {layer}"
        assert _multiset(shapes) == _multiset(want), (case, layer, kind)
    for layer, ops in twin.items():  # and the twin has no parameters the placement leaves out
        for kind in ParamKind:
            if _twin_shapes(ops, kind):
                assert (layer, kind) in claims, (case, layer, kind)


_NEEDS = {  # what a payload moves, and so which parameters its layer must hold
    Payload.PARAMS: ParamKind.DENSE, Payload.GRADS: ParamKind.DENSE, Payload.GRAD_SHARD: ParamKind.DENSE,
    Payload.EXPERT_GRADS: ParamKind.EXPERT, Payload.ROUTED_TOKENS: ParamKind.EXPERT,
    **{p: ParamKind.SPARSE for p in (Payload.IDS, Payload.EMB_OUTPUTS, Payload.EMB_GRADS, Payload.ROWS,
                                     Payload.ROW_GRADS, Payload.TABLE_SHARD, Payload.HOT_ROW_GRADS)},
}  # fmt: skip


@pytest.mark.parametrize("case", CASES)
def test_collectives_move_parameters_that_exist(case):
    """Every collective of a layer's placement belongs to parameters the executor's layer holds,
    and runs over a group those parameters are laid out on (sharded or replicated)."""
    model, layers = _executor(case), placements(_scenario(case))
    claims = _claims(model, layers)
    for lp in layers:
        groups: dict[ParamKind, tuple] = {}  # the tables' cold and hot rows are laid out apart
        for p in lp.params:
            groups[p.kind] = (*groups.get(p.kind, ()), *p.shard, *p.replicate)
        for c in lp.collectives:
            kind = _NEEDS[c.payload]
            assert claims.get((lp.layer, kind)), f"{case}: {c.name} moves {c.payload} but {lp.layer} has no {kind}"
            assert c.group in groups[kind], (case, c.name, c.group, groups[kind])
            assert c.payload not in GATHERED | REDUCED or c.phase != Phase.DATA


@pytest.mark.parametrize("case", CASES)
def test_graph_collectives_are_the_placements(case):
    """The twin's graph issues exactly the placement's collectives over groups of more than one
    rank (kind and group as declared; micro-batch prefixes aside)."""
    s = _scenario(case)
    graph = build_graph(s, Hardware.of(s))
    issued = {(op.name.split(".", 1)[1] if op.name.startswith("mb") else op.name, op.op_class, op.axis)
              for op in graph if op.stream != COMPUTE}  # fmt: skip
    declared = {(c.name, c.kind, c.group) for lp in placements(s) for c in lp.collectives
                if axis_group(s, c.group)[0] > 1}  # fmt: skip
    assert issued == declared, (case, sorted(issued ^ declared))
    assert {CommGroup(a) for _, _, a in issued} <= set(CommGroup)


def test_a_parameter_no_placement_declares_is_refused():
    """The sharding step reads the placements: a parameter none of them names would be neither
    counted by the twin nor sharded, so it is refused by name."""
    with torch.device("meta"):
        model = build_model(_scenario("debug-cpu"))
    model.stray = torch.nn.Linear(2, 2, device="meta")
    with pytest.raises(ValueError, match=r"^parameter stray\.weight is in no layer's placement"):
        claim_parameters(model, placements(_scenario("debug-cpu")))
