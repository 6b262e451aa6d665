"""Batches and a synthetic data generator with a learnable hidden label function.

``Batch`` holds one micro-batch in the layout the model reads:

- ``dense [B, F]`` float features;
- ``pooled``: per pooled table name, ``(values, offsets)`` — the ids of sample ``b`` are
  ``values[offsets[b]:offsets[b+1]]`` (sum-pooled by the model);
- ``sequences``: per sequence group name, a ``SequenceIds`` with ``lengths [B]``,
  ``offsets [B+1]`` and one id per token per table (``ids[table] [ΣL_g]``);
- ``labels [B, tasks]`` in {0, 1}.

``SyntheticData(scenario, seed)`` draws batches of ``training.micro_batch`` samples: pooling
factors and lengths from the scenario's ``LengthDist``; ids from a power law with exponent
``id_skew`` over each table's rows (low ids popular); labels Bernoulli from a fixed hidden
function of the features (a random hidden vector per id, hashed down to at most 4096 rows per
table, mean-pooled, plus a random projection of the dense features), so that a model can
learn it. The hidden function depends only on ``seed``; ``split`` picks an independent stream
of samples ("train" or "eval") from the same law.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import torch
from torch import Tensor

from kernels.embedding.layout import pack_bags, stack_ids
from scenarios.schema import DLRMModel, Embeddings, GEMModel, Scenario, SequenceGroup, TableFamily

HIDDEN_DIM = 8
HIDDEN_ROWS = 4096  # a power of two (_hidden_mean hashes with a mask)


@dataclass(frozen=True)
class TableGroup:
    """Tables of one ``dim`` looked up in one launch (``kernels.embedding``): their names and rows
    in config order, and for a sequence group each table's first column in the concatenated
    ``[ΣL_g, D_g]`` output (config order of the whole group)."""

    dim: int
    names: tuple[str, ...]
    rows: tuple[int, ...]
    cols: tuple[int, ...] = ()


def _by_dim(families: list[TableFamily], with_cols: bool) -> list[TableGroup]:
    groups: dict[int, list[tuple[str, int, int]]] = {}
    col = 0
    for fam in families:
        for name in fam.table_names():
            groups.setdefault(fam.dim, []).append((name, fam.rows, col))
            col += fam.dim
    return [TableGroup(dim, tuple(n for n, _, _ in ts), tuple(r for _, r, _ in ts),
                       tuple(c for _, _, c in ts) if with_cols else ())
            for dim, ts in groups.items()]


def pooled_table_groups(embeddings: Embeddings) -> list[TableGroup]:
    """The pooled tables grouped by dim (first-appearance order; tables in config order)."""
    return _by_dim(list(embeddings.pooled), with_cols=False)


def sequence_table_groups(group: SequenceGroup) -> list[TableGroup]:
    """A sequence group's tables grouped by dim, with their output columns."""
    return _by_dim(list(group.tables), with_cols=True)


@dataclass
class SequenceIds:
    """One sequence group: ``lengths [B]``, ``offsets [B+1]``, ``ids[table] [ΣL_g]``."""

    lengths: Tensor
    offsets: Tensor
    ids: dict[str, Tensor]


@dataclass
class Batch:
    dense: Tensor
    pooled: dict[str, tuple[Tensor, Tensor]]
    sequences: dict[str, SequenceIds] = field(default_factory=dict)
    labels: Tensor | None = None
    # the ids in the kernels' layouts (``pack``), keyed ("pooled", names) / ("seq", group, names)
    packed: dict = field(default_factory=dict, repr=False, compare=False)
    # the model config this batch was validated for (``validate`` is then a no-op)
    validated_for: object = field(default=None, repr=False, compare=False)
    # > 0: the packed id layouts are padded to a multiple of this many ids (``pack``): a
    # static-shape batch, whose tensor shapes repeat from batch to batch (CUDA graphs)
    bucket: int = field(default=0, compare=False)

    @property
    def size(self) -> int:
        return self.dense.shape[0]

    def seq_lengths(self) -> Tensor:
        """Per-sample total sequence length (all groups together), ``[B]`` int64."""
        total = torch.zeros(self.size, dtype=torch.int64, device=self.dense.device)
        for g in self.sequences.values():
            total = total + g.lengths
        return total

    def map(self, fn) -> Batch:
        """A new batch with ``fn`` applied to every tensor (packed layouts too)."""
        return Batch(
            dense=fn(self.dense),
            pooled={t: (fn(v), fn(o)) for t, (v, o) in self.pooled.items()},
            sequences={
                n: SequenceIds(fn(g.lengths), fn(g.offsets), {t: fn(i) for t, i in g.ids.items()})
                for n, g in self.sequences.items()
            },
            labels=None if self.labels is None else fn(self.labels),
            packed={k: tuple(fn(x) for x in v) if isinstance(v, tuple) else fn(v) for k, v in self.packed.items()},
            validated_for=self.validated_for,
            bucket=self.bucket,
        )

    def to(self, device: torch.device | str, *, non_blocking: bool = False) -> Batch:
        return self.map(lambda t: t.to(device, non_blocking=non_blocking))

    def pin_memory(self) -> Batch:
        return self.map(lambda t: t.pin_memory())

    def record_stream(self, stream) -> None:
        """Mark every tensor as used on ``stream`` (tensors copied on a side stream, used on another)."""
        self.map(lambda t: t.record_stream(stream) or t)

    def tensors(self) -> list[Tensor]:
        out: list[Tensor] = []
        self.map(lambda t: out.append(t) or t)
        return out

    # ---- the kernels' id layouts ----------------------------------------------------------------
    def pooled_packed(self, group: TableGroup) -> tuple[Tensor, Tensor]:
        """``(indices, offsets [T·B+1])`` of ``group``'s pooled tables (``kernels.embedding.layout.pack_bags``)."""
        key = ("pooled", group.names)
        if key not in self.packed:
            indices, offsets = pack_bags([self.pooled[n] for n in group.names])
            self.packed[key] = (self._pad(indices), offsets)
        return self.packed[key]

    def sequence_packed(self, group_name: str, group: TableGroup) -> Tensor:
        """``ids [T, ΣL_g]`` of ``group``'s tables of sequence group ``group_name``."""
        key = ("seq", group_name, group.names)
        if key not in self.packed:
            ids = self.sequences[group_name].ids
            self.packed[key] = self._pad(stack_ids([ids[n] for n in group.names]))
        return self.packed[key]

    def pack(self, model: GEMModel | DLRMModel, *, bucket: int = 0) -> Batch:
        """Fill ``packed`` for every table group of ``model`` (done on the host by ``Prefetcher``).

        ``bucket > 0`` makes a static-shape batch: every packed layout is padded with id 0 to a
        multiple of ``bucket`` ids (the pooled ``indices`` past their last offset, which no bag
        reads; the sequence ids ``[T, N]`` to ``N`` rounded up, whose extra tokens come after every
        sample's), so that batches of similar size have equal shapes. The model gives padding
        tokens zero attention output and zero gradient (``GEMModule``), and the lookups' backward
        skips padding ids, so padding changes no output and no update."""
        if bucket < 0:
            raise ValueError(f"bucket ({bucket}) must be >= 0 ids (0: no padding)")
        if self.bucket != bucket:
            self.packed.clear()
            self.bucket = bucket
        for g in pooled_table_groups(model.embeddings):
            self.pooled_packed(g)
        for sg in model.embeddings.sequences:
            for g in sequence_table_groups(sg):
                self.sequence_packed(sg.name, g)
        return self

    def _pad(self, t: Tensor) -> Tensor:
        """``t [..., n]`` padded with zeros to ``n`` rounded up to a multiple of ``bucket``."""
        n = t.shape[-1]
        if self.bucket <= 0 or n % self.bucket == 0 and n:
            return t
        return torch.nn.functional.pad(t, (0, max(-(-n // self.bucket), 1) * self.bucket - n))

    def validate(self, model: GEMModel | DLRMModel) -> None:
        """Raise a one-line ``ValueError`` (field, value, fix) when the batch does not fit ``model``.

        Run it on the host batch, before any copy to the GPU: a bad id must never reach a CUDA
        kernel (it would read another table's row, or assert). Once a batch passed for ``model``
        (``validated_for``, kept by ``to``), validating it again is a no-op, so the model's own
        call costs no device sync; ``validate`` drops the packed layouts it may have to re-derive.
        """
        if self.validated_for is model:
            return
        self.packed.clear()
        B = self.size
        if self.dense.dim() != 2 or self.dense.shape[1] != model.dense_features:
            raise ValueError(
                f"batch.dense: shape {tuple(self.dense.shape)}, expected (B, {model.dense_features})"
                f" for model.dense_features = {model.dense_features}"
            )
        if not self.dense.is_floating_point() or not bool(torch.isfinite(self.dense).all()):
            raise ValueError(f"batch.dense: dtype {self.dense.dtype} with non-finite or non-float values; "
                             "pass finite floats (impute missing features)")
        for fam in model.embeddings.pooled:
            for name in fam.table_names():
                if name not in self.pooled:
                    raise ValueError(f"batch.pooled is missing table '{name}'; add its (values, offsets)")
                values, offsets = self.pooled[name]
                where = f"batch.pooled['{name}']"
                _check_int(f"{where} values", values)
                _check_int(f"{where} offsets", offsets)
                _check_offsets(where, offsets, len(values), B)
                _check_ids(where, values, fam.rows)
        for group in model.embeddings.sequences:
            if group.name not in self.sequences:
                raise ValueError(f"batch.sequences is missing group '{group.name}'; add its SequenceIds")
            seq = self.sequences[group.name]
            where = f"batch.sequences['{group.name}']"
            _check_int(f"{where}.lengths", seq.lengths)
            _check_int(f"{where}.offsets", seq.offsets)
            _check_lengths(where, seq.lengths, seq.offsets, B, group.length.max)
            total = int(seq.offsets[-1])
            for fam in group.tables:
                for name in fam.table_names():
                    if name not in seq.ids:
                        raise ValueError(f"{where}.ids is missing table '{name}'; add one id per token")
                    ids = seq.ids[name]
                    _check_int(f"{where}.ids['{name}']", ids)
                    if ids.dim() != 1 or len(ids) != total:
                        raise ValueError(
                            f"{where}.ids['{name}']: has {ids.numel()} ids, but the lengths add up "
                            f"to {total} tokens (one id per token)"
                        )
                    _check_ids(f"{where}.ids['{name}']", ids, fam.rows)
        if self.labels is not None:
            if tuple(self.labels.shape) != (B, len(model.tasks.names)):
                raise ValueError(
                    f"batch.labels: shape {tuple(self.labels.shape)}, expected ({B}, {len(model.tasks.names)})"
                    " (one column per task)"
                )
            bad = ~((self.labels >= 0) & (self.labels <= 1))
            if bool(bad.any()):
                b, task = (int(x) for x in torch.nonzero(bad)[0])
                raise ValueError(f"batch.labels: value {float(self.labels[b, task])} at sample {b}, task {task}; "
                                 "labels must be in [0, 1]")
        self.validated_for = model


def _check_int(where: str, t: Tensor) -> None:
    if t.is_floating_point() or t.is_complex() or t.dtype == torch.bool:
        raise ValueError(f"{where}: dtype {t.dtype}; ids, lengths and offsets must be integers (use int64)")


def _check_offsets(where: str, offsets: Tensor, n: int, B: int) -> None:
    if offsets.dim() != 1 or len(offsets) != B + 1:
        raise ValueError(f"{where}: offsets must have B+1 = {B + 1} entries, got {tuple(offsets.shape)}")
    if int(offsets[0]) != 0 or int(offsets[-1]) != n or bool((offsets[1:] < offsets[:-1]).any()):
        raise ValueError(
            f"{where}: offsets do not add up: they must start at 0, never decrease and end at "
            f"len(values) = {n} (got first {int(offsets[0])}, last {int(offsets[-1])})"
        )


def _check_lengths(where: str, lengths: Tensor, offsets: Tensor, B: int, longest: int) -> None:
    if lengths.dim() != 1 or len(lengths) != B:
        raise ValueError(f"{where}: lengths must have B = {B} entries, got {tuple(lengths.shape)}")
    if bool((lengths < 0).any()):
        b = int(torch.nonzero(lengths < 0)[0])
        raise ValueError(f"{where}: negative length {int(lengths[b])} at sample {b}; lengths must be >= 0")
    if bool((lengths > longest).any()):  # the model's attention is sized (and GDPA normalised) by it
        b = int(torch.nonzero(lengths > longest)[0])
        raise ValueError(f"{where}: length {int(lengths[b])} at sample {b} exceeds the scenario's length.max "
                         f"= {longest}; truncate the sequence or raise length.max")
    expected = torch.cat([lengths.new_zeros(1), torch.cumsum(lengths, 0)])
    if offsets.shape != expected.shape or not torch.equal(offsets, expected):
        raise ValueError(f"{where}: offsets do not add up: they must be 0 then the running sum of lengths")


def _check_ids(where: str, ids: Tensor, rows: int) -> None:
    if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= rows):
        bad = int(ids.min()) if int(ids.min()) < 0 else int(ids.max())
        raise ValueError(f"{where}: id {bad} out of range [0, {rows}) for a table of {rows} rows; "
                         f"hash or clip ids into the table")


# ---- synthetic data ----------------------------------------------------------------------------
def zipf_ids(rng: np.random.Generator, n: int, rows: int, skew: float) -> np.ndarray:
    """``n`` ids in ``[0, rows)`` with ``P(id) ≈ ∝ (id+1)^-skew`` (continuous power law, floored)."""
    if skew == 0 or rows == 1:
        return rng.integers(0, rows, size=n, dtype=np.int64)
    u = rng.random(n)
    top = float(rows + 1)
    if abs(skew - 1.0) < 1e-6:
        x = top**u
    else:
        e = 1.0 - skew
        x = ((top**e - 1.0) * u + 1.0) ** (1.0 / e)
    return np.clip(np.floor(x).astype(np.int64) - 1, 0, rows - 1)


class SyntheticData:
    """An endless stream of ``Batch``es of ``training.micro_batch`` samples (``next(data)``).

    Batch ``i`` of a split is drawn from its own generator, seeded ``(seed, split, i)``, so a rank
    can draw its share of one global stream without drawing the rest: with ``rank`` and ``world``
    this stream is batches ``rank, rank + world, rank + 2·world, …``. A step of ``accum``
    micro-batches on each of ``world`` ranks then trains exactly the ``accum · world`` consecutive
    batches that one process would (its micro-batches ``s·accum·world …``), whatever the world.
    ``start``: the global stream's batches already consumed (a resumed run's data position,
    ``executor.checkpoint``): this rank's first batch is ``start + rank``."""

    def __init__(self, scenario: Scenario, seed: int = 0, *, split: Literal["train", "eval"] = "train",
                 rank: int = 0, world: int = 1, start: int = 0):
        if not 0 <= rank < world:
            raise ValueError(f"rank ({rank}) must be in [0, world = {world})")
        if start < 0:
            raise ValueError(f"start ({start}) must be >= 0")
        self.model = scenario.model
        self.batch_size = scenario.training.micro_batch
        hidden = np.random.default_rng([seed, 0])
        self._seed, self._split = seed, 1 if split == "train" else 2
        self._next, self._step = start + rank, world  # the next batch's index in the global stream, and the stride
        self._hidden = {
            name: hidden.standard_normal((min(fam.rows, HIDDEN_ROWS), HIDDEN_DIM))
            for fam in self.model.embeddings.families() for name in fam.table_names()
        }
        F, T = self.model.dense_features, len(self.model.tasks.names)
        self._w_dense = hidden.standard_normal((F, HIDDEN_DIM)) / np.sqrt(F)
        self._w_task = hidden.standard_normal((HIDDEN_DIM, T))
        self._bias = np.array([0.0] + [-1.0] * (T - 1))
        # scale the hidden logits to std 2 (a fixed constant, measured once on a calibration draw)
        calib = np.random.default_rng([seed, 3])
        raw = self._raw_logits(self._features(calib, 4096)[3])
        self._scale = 2.0 / np.maximum(raw.std(axis=0), 1e-6)

    def __iter__(self) -> SyntheticData:
        return self

    def __next__(self) -> Batch:
        return self.batch(self.batch_size)

    def batch(self, n: int) -> Batch:
        """The stream's next batch, of ``n`` samples."""
        rng = np.random.default_rng([self._seed, self._split, self._next])
        self._next += self._step
        dense, pooled, seqs, f = self._features(rng, n)
        p = 1.0 / (1.0 + np.exp(-(self._raw_logits(f) * self._scale + self._bias)))
        labels = (rng.random(p.shape) < p).astype(np.float32)
        return Batch(
            dense=torch.from_numpy(dense),
            pooled={t: (torch.from_numpy(v), torch.from_numpy(o)) for t, (v, o) in pooled.items()},
            sequences={
                g: SequenceIds(torch.from_numpy(ln), torch.from_numpy(_offsets(ln)),
                               {t: torch.from_numpy(i) for t, i in ids.items()})
                for g, (ln, ids) in seqs.items()
            },
            labels=torch.from_numpy(labels),
        )

    # ---- internals ------------------------------------------------------------------------------
    def _features(self, rng: np.random.Generator, n: int):
        """Draw one batch of raw features and their hidden feature vector ``f [n, HIDDEN_DIM]``."""
        dense = rng.standard_normal((n, self.model.dense_features)).astype(np.float32)
        f = dense @ self._w_dense
        pooled = {}
        for fam in self.model.embeddings.pooled:
            for name in fam.table_names():
                counts = fam.pooling.sample(rng, n)
                ids = zipf_ids(rng, int(counts.sum()), fam.rows, fam.id_skew)
                pooled[name] = (ids, _offsets(counts))
                f = f + self._hidden_mean(name, fam, ids, counts)
        seqs = {}
        for group in self.model.embeddings.sequences:
            lengths = group.length.sample(rng, n)
            ids = {}
            for fam in group.tables:
                for name in fam.table_names():
                    ids[name] = zipf_ids(rng, int(lengths.sum()), fam.rows, fam.id_skew)
                    f = f + self._hidden_mean(name, fam, ids[name], lengths)
            seqs[group.name] = (lengths, ids)
        return dense, pooled, seqs, f

    def _hidden_mean(self, name: str, fam: TableFamily, ids: np.ndarray, counts: np.ndarray) -> np.ndarray:
        """Mean hidden vector of each sample's ids (zeros for a sample with none): ``[n, HIDDEN_DIM]``
        (the ids are sample after sample: one segment sum per sample)."""
        table = self._hidden[name]
        # (& HIDDEN_ROWS-1 is % HIDDEN_ROWS, a power of two, in a fifth of the time)
        rows = ids if fam.rows <= HIDDEN_ROWS else (ids * 2654435761) & (HIDDEN_ROWS - 1)
        sums = np.zeros((len(counts), HIDDEN_DIM))
        if len(ids):
            starts = np.cumsum(counts) - counts
            full = counts > 0  # reduceat gives an empty segment its start row: keep those at zero
            sums[full] = np.add.reduceat(np.take(table, rows, axis=0), starts[full], axis=0)
        return sums / np.maximum(counts, 1)[:, None]

    def _raw_logits(self, f: np.ndarray) -> np.ndarray:
        """Unscaled per-task logits of the hidden feature vectors ``f``: ``tanh(f) @ W``."""
        return np.tanh(f) @ self._w_task


def _offsets(counts: np.ndarray) -> np.ndarray:
    return np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)


# ---- off the critical path ---------------------------------------------------------------------
_DONE = object()


class _Produced(torch.utils.data.IterableDataset):
    """``source``'s batches validated and packed for ``model`` (run in a worker process by
    ``Prefetcher``); a data error is yielded as an item, so the consumer raises it unchanged."""

    def __init__(self, source: Iterator[Batch], model: GEMModel | DLRMModel, bucket: int = 0):
        super().__init__()
        self.source, self.model, self.bucket = source, model, bucket

    def __iter__(self):
        try:
            for batch in self.source:
                batch.validate(self.model)
                yield batch.pack(self.model, bucket=self.bucket)
        except Exception as e:  # noqa: BLE001 - handed to the consumer, raised there
            yield e


def _one_thread(_worker_id: int) -> None:
    torch.set_num_threads(1)


class Prefetcher:
    """Batches of ``source`` for ``model`` on ``device``, produced off the critical path.

    Each batch is validated (``Batch.validate``: bad data fails here with its one-line
    ``ValueError``, before any CUDA op), packed into the kernels' id layouts (``Batch.pack``),
    and — with CUDA — pinned and copied to the GPU with ``non_blocking`` copies on a side stream,
    all on a background thread ``depth`` batches ahead. ``next()`` makes the current stream wait
    for that copy (an event, no host sync). Without CUDA it validates and returns the host batch
    in the calling thread (no thread, the same batches in the same order).

    ``bucket``: pack static-shape batches (``Batch.pack``), padded to multiples of ``bucket`` ids.

    ``processes`` (opt-in): draw, validate and pack in a worker process
    (``torch.utils.data.DataLoader``, one worker, so the order is the source's) instead of the
    background thread, which then only pins and copies. Drawing a ``gem-h200-1gpu`` batch is
    ~100 ms of numpy; in a thread it holds the GIL against the thread that launches the step's
    kernels. Off by default: the one H200 run with it (and a padded token stream) was not faster
    (hwmodels/data/runs/h200-2026-11-30-executor/README.md).
    """

    def __init__(self, source: Iterator[Batch], model: GEMModel | DLRMModel, device: torch.device | str, *,
                 depth: int = 2, processes: bool = False, bucket: int = 0):
        self.source, self.model, self.device = source, model, torch.device(device)
        self.bucket = bucket
        self.wait_s = 0.0  # host time spent waiting for a batch in next(), summed
        self._thread = None
        self.processes = bool(processes)
        self._loader = None
        if self.processes:
            self._loader = torch.utils.data.DataLoader(
                _Produced(source, model, bucket), batch_size=None, num_workers=1, prefetch_factor=max(depth, 1),
                worker_init_fn=_one_thread, multiprocessing_context="fork",
            )
        self._host = self._host_batches()  # consumed by the background thread on CUDA
        if self.device.type == "cuda":
            self._stream = torch.cuda.Stream(self.device)
            self._queue: queue.Queue = queue.Queue(maxsize=max(depth, 1))
            self._stop = threading.Event()
            self._thread = threading.Thread(target=self._produce, name="prefetch", daemon=True)
            self._thread.start()

    def _host_batches(self):
        """Validated, packed host batches: from the worker process, or drawn here."""
        for item in self._loader if self.processes else _Produced(self.source, self.model, self.bucket):
            if isinstance(item, BaseException):
                raise item
            item.validated_for = self.model  # (in the worker: validated against an equal config)
            yield item

    def __iter__(self) -> Prefetcher:
        return self

    def __next__(self) -> Batch:
        import time

        start = time.perf_counter()
        try:
            if self._thread is None:
                if not self.processes:
                    batch = next(self.source)
                    batch.validate(self.model)
                    return batch.pack(self.model, bucket=self.bucket) if self.bucket else batch
                return next(self._host)
            item = self._queue.get()
            if item is _DONE:
                raise StopIteration
            if isinstance(item, BaseException):
                raise item
            batch, event, _host = item
            stream = torch.cuda.current_stream(self.device)
            stream.wait_event(event)
            batch.record_stream(stream)  # allocated on the side stream, used (and freed) on this one
            return batch
        finally:
            self.wait_s += time.perf_counter() - start

    def _produce(self) -> None:
        try:
            with torch.cuda.device(self.device):
                for batch in self._host:
                    if self._stop.is_set():
                        return
                    host = batch.pin_memory()
                    with torch.cuda.stream(self._stream):
                        dev = host.to(self.device, non_blocking=True)
                        event = torch.cuda.Event()
                        event.record(self._stream)
                    self._put((dev, event, host))  # host stays alive until the copy is consumed
                self._put(_DONE)
        except BaseException as e:  # noqa: BLE001 - handed to the consumer, raised there
            self._put(e)

    def _put(self, item) -> None:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.1)
                return
            except queue.Full:
                continue

    def close(self) -> None:
        """Stop the background thread (it finishes the batch it is on) and the worker process."""
        if self._thread is not None:
            self._stop.set()
            self._thread.join(timeout=10)
            self._thread = None
        if self._loader is not None:
            self._host = None  # the DataLoader iterator it holds shuts its worker down
            self._loader = None
