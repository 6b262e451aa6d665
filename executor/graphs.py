"""Whole training steps replayed from CUDA graphs, one graph per static batch shape.

A ``gem-h200-1gpu`` step launches ~1,800 kernels; launched one by one from Python the GPU waits
for the host about half the step (hwmodels/data/runs/h200-2026-11-30-executor/README.md). A CUDA
graph launches the whole step — forward, backward (with the embeddings' fused row-wise Adagrad),
gradient clipping and the dense optimizer — with one call.

A graph replays fixed shapes and fixed addresses, so:

- batches are static-shape (``Batch.pack(bucket=…)``): their id layouts are padded to a
  multiple of ``bucket`` ids, so a few shapes recur (``gem-h200-1gpu``: ΣL ≈ 197k ± 2k tokens
  falls in 2–3 buckets of 8,192), and the model needs no host value of a batch (GDPA's
  ``max_len`` is the scenario's, ``GEMModule.max_len``);
- the first batch of each shape runs eagerly (a real training step, which also warms the
  compiled graphs and Triton kernels up for the shape), then the step is captured for that shape
  with its own static input buffers; a later batch of that shape is copied into them (a few small
  device copies) and the graph replayed;
- every graph shares one memory pool (they never run at once, and nothing a graph allocates is
  needed after its replay except the loss, read at once);
- nothing in the step may synchronise with the host: the embeddings' sparse update must run
  inside the backward (``kernels.embedding.tbe.RowwiseAdagradInBackward``), the lookups and
  attention must be the Triton kernels, and the dense optimizer ``capturable``.

Past ``max_graphs`` shapes, further new shapes run eagerly (counted in ``eager_steps``). While a
blockwise-fp8 layer still owes its guard or ``auto`` decision (a host read), steps run eagerly and
nothing is captured.
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import Tensor

from executor.data import Batch, SequenceIds


def static_inputs(batch: Batch) -> list[Tensor]:
    """The tensors of a packed batch that the model reads on the Triton path, in a fixed order:
    dense features, labels, each sequence group's lengths and offsets, then the packed id
    layouts (sorted by key). The raw per-table ids are not among them (their shapes are ΣL)."""
    out = [batch.dense, batch.labels]
    for name in sorted(batch.sequences):
        out += [batch.sequences[name].lengths, batch.sequences[name].offsets]
    for key in sorted(batch.packed, key=repr):
        value = batch.packed[key]
        out += list(value) if isinstance(value, tuple) else [value]
    return out


def shape_key(batch: Batch) -> tuple:
    """What a graph is specialised to: the shapes and dtypes of ``static_inputs``."""
    return tuple((tuple(t.shape), t.dtype) for t in static_inputs(batch))


def static_copy(batch: Batch) -> Batch:
    """A batch of fresh buffers holding ``batch``'s ``static_inputs`` (the raw ids left out), to
    capture a graph on and to copy later batches of the same shape into."""
    if batch.labels is None or not batch.packed:
        raise ValueError("a graphed step needs a packed batch with labels (Prefetcher(bucket=…) packs them)")
    return Batch(
        dense=batch.dense.clone(), pooled={},
        sequences={n: SequenceIds(g.lengths.clone(), g.offsets.clone(), {}) for n, g in batch.sequences.items()},
        labels=batch.labels.clone(),
        packed={k: tuple(x.clone() for x in v) if isinstance(v, tuple) else v.clone() for k, v in batch.packed.items()},
        validated_for=batch.validated_for, bucket=batch.bucket,
    )


class _Graph:
    def __init__(self, graph: torch.cuda.CUDAGraph, inputs: Batch, loss: Tensor):
        self.graph, self.inputs, self.loss = graph, inputs, loss
        self._dst = static_inputs(inputs)

    def replay(self, batch: Batch) -> Tensor:
        for dst, src in zip(self._dst, static_inputs(batch)):
            dst.copy_(src, non_blocking=True)
        self.graph.replay()
        return self.loss


class GraphedSteps:
    """``steps(batch) -> loss`` (a 0-dim device tensor): replay the graph of ``batch``'s shape,
    or run ``step`` eagerly and capture it for that shape (see the module docstring).

    ``step(batches) -> loss tensor`` is the whole training step (zero grads, forward, backward,
    optimizers) with no host sync. ``model.autocast_cache`` is switched off: autocast's cache of
    cast weights must not outlive a capture."""

    def __init__(self, model: torch.nn.Module, step: Callable[[list[Batch]], Tensor], *, max_graphs: int = 8):
        if max_graphs < 1:
            raise ValueError(f"max_graphs ({max_graphs}) must be >= 1")
        self.model, self.step, self.max_graphs = model, step, max_graphs
        self.graphs: dict[tuple, _Graph] = {}
        self.pool = None
        self.replays = self.eager_steps = 0
        if hasattr(model, "autocast_cache"):
            model.autocast_cache = False

    def __call__(self, batch: Batch) -> Tensor:
        key = shape_key(batch)
        graph = self.graphs.get(key)
        if graph is not None:
            self.replays += 1
            return graph.replay(batch)
        from executor.runtime import eager_while_guarded
        from kernels.mxfp8.linear import guard_pending

        if guard_pending(self.model):  # fp8 layers' guards and auto decisions read the host: eager steps first
            with eager_while_guarded(self.model, True):
                loss = self.step([batch])
            self.eager_steps += 1
            return loss
        loss = self.step([batch])  # eager: a real step, and the warm-up for this shape
        self.eager_steps += 1
        if len(self.graphs) < self.max_graphs:
            self.graphs[key] = self._capture(batch)
        return loss

    def eager(self, batch: Batch) -> Tensor:
        """One step without graphs (profiled steps: the profiler attributes kernels to ops only
        when they are launched one by one)."""
        self.eager_steps += 1
        return self.step([batch])

    def _capture(self, batch: Batch) -> _Graph:
        inputs = static_copy(batch)
        graph = torch.cuda.CUDAGraph()
        torch.cuda.synchronize()
        try:
            # the attention kernels' work lists: built once per offsets tensor inside the graph
            # (the capture's static ones) and rebuilt on every replay; lists built before the
            # capture are never baked into it (kernels/flash/work.py).
            # thread_local: the data loader's thread keeps pinning and copying the next batches
            # on its own stream meanwhile; under the default "global" mode one of its calls
            # can invalidate this capture (s24, s25: "operation failed due to a previous error
            # during capture", whenever the step's timing let the two meet)
            with torch.cuda.graph(graph, pool=self.pool, capture_error_mode="thread_local"):
                loss = self.step([inputs])
        except RuntimeError as e:  # (torch.AcceleratorError is one): something in the step syncs
            raise RuntimeError(f"capturing the training step as a CUDA graph failed: {str(e).splitlines()[0]}; "
                               "train with --set execution.cuda_graphs=false") from e
        if self.pool is None:
            self.pool = graph.pool()
        return _Graph(graph, inputs, loss)

    def summary(self) -> dict[str, int]:
        return {"graphs": len(self.graphs), "replays": self.replays, "eager_steps": self.eager_steps}


__all__ = ["GraphedSteps", "shape_key", "static_copy", "static_inputs"]
