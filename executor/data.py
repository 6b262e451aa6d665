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

from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import torch
from torch import Tensor

from scenarios.schema import DLRMModel, GEMModel, Scenario, TableFamily

HIDDEN_DIM = 8
HIDDEN_ROWS = 4096


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

    @property
    def size(self) -> int:
        return self.dense.shape[0]

    def seq_lengths(self) -> Tensor:
        """Per-sample total sequence length (all groups together), ``[B]`` int64."""
        total = torch.zeros(self.size, dtype=torch.int64, device=self.dense.device)
        for g in self.sequences.values():
            total = total + g.lengths
        return total

    def to(self, device: torch.device | str) -> Batch:
        return Batch(
            dense=self.dense.to(device),
            pooled={t: (v.to(device), o.to(device)) for t, (v, o) in self.pooled.items()},
            sequences={
                n: SequenceIds(g.lengths.to(device), g.offsets.to(device),
                               {t: i.to(device) for t, i in g.ids.items()})
                for n, g in self.sequences.items()
            },
            labels=None if self.labels is None else self.labels.to(device),
        )

    def validate(self, model: GEMModel | DLRMModel) -> None:
        """Raise a one-line ``ValueError`` naming the table when the batch does not fit ``model``."""
        B = self.size
        if self.dense.dim() != 2 or self.dense.shape[1] != model.dense_features:
            raise ValueError(
                f"batch.dense: shape {tuple(self.dense.shape)}, expected (B, {model.dense_features})"
                f" for model.dense_features = {model.dense_features}"
            )
        for fam in model.embeddings.pooled:
            for name in fam.table_names():
                if name not in self.pooled:
                    raise ValueError(f"batch.pooled is missing table '{name}'; add its (values, offsets)")
                values, offsets = self.pooled[name]
                where = f"batch.pooled['{name}']"
                _check_offsets(where, offsets, len(values), B)
                _check_ids(where, values, fam.rows)
        for group in model.embeddings.sequences:
            if group.name not in self.sequences:
                raise ValueError(f"batch.sequences is missing group '{group.name}'; add its SequenceIds")
            seq = self.sequences[group.name]
            where = f"batch.sequences['{group.name}']"
            _check_lengths(where, seq.lengths, seq.offsets, B)
            total = int(seq.offsets[-1])
            for fam in group.tables:
                for name in fam.table_names():
                    if name not in seq.ids:
                        raise ValueError(f"{where}.ids is missing table '{name}'; add one id per token")
                    ids = seq.ids[name]
                    if ids.dim() != 1 or len(ids) != total:
                        raise ValueError(
                            f"{where}.ids['{name}']: has {ids.numel()} ids, but the lengths add up "
                            f"to {total} tokens (one id per token)"
                        )
                    _check_ids(f"{where}.ids['{name}']", ids, fam.rows)
        if self.labels is not None and tuple(self.labels.shape) != (B, len(model.tasks.names)):
            raise ValueError(
                f"batch.labels: shape {tuple(self.labels.shape)}, expected ({B}, {len(model.tasks.names)})"
                " (one column per task)"
            )


def _check_offsets(where: str, offsets: Tensor, n: int, B: int) -> None:
    if offsets.dim() != 1 or len(offsets) != B + 1:
        raise ValueError(f"{where}: offsets must have B+1 = {B + 1} entries, got {tuple(offsets.shape)}")
    if int(offsets[0]) != 0 or int(offsets[-1]) != n or bool((offsets[1:] < offsets[:-1]).any()):
        raise ValueError(
            f"{where}: offsets do not add up: they must start at 0, never decrease and end at "
            f"len(values) = {n} (got first {int(offsets[0])}, last {int(offsets[-1])})"
        )


def _check_lengths(where: str, lengths: Tensor, offsets: Tensor, B: int) -> None:
    if lengths.dim() != 1 or len(lengths) != B:
        raise ValueError(f"{where}: lengths must have B = {B} entries, got {tuple(lengths.shape)}")
    if bool((lengths < 0).any()):
        b = int(torch.nonzero(lengths < 0)[0])
        raise ValueError(f"{where}: negative length {int(lengths[b])} at sample {b}")
    expected = torch.cat([lengths.new_zeros(1), torch.cumsum(lengths, 0)])
    if offsets.shape != expected.shape or not torch.equal(offsets, expected):
        raise ValueError(f"{where}: offsets do not add up: they must be 0 then the running sum of lengths")


def _check_ids(where: str, ids: Tensor, rows: int) -> None:
    if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= rows):
        bad = int(ids.min()) if int(ids.min()) < 0 else int(ids.max())
        raise ValueError(f"{where}: id {bad} out of range [0, {rows}) for a table of {rows} rows")


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
    """An endless stream of ``Batch``es of ``training.micro_batch`` samples (``next(data)``)."""

    def __init__(self, scenario: Scenario, seed: int = 0, *, split: Literal["train", "eval"] = "train"):
        self.model = scenario.model
        self.batch_size = scenario.training.micro_batch
        hidden = np.random.default_rng([seed, 0])
        self.rng = np.random.default_rng([seed, 1 if split == "train" else 2])
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
        dense, pooled, seqs, f = self._features(self.rng, n)
        p = 1.0 / (1.0 + np.exp(-(self._raw_logits(f) * self._scale + self._bias)))
        labels = (self.rng.random(p.shape) < p).astype(np.float32)
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
        table = self._hidden[name]
        rows = ids if fam.rows <= HIDDEN_ROWS else (ids * 2654435761) % HIDDEN_ROWS
        vecs = table[rows]
        sample = np.repeat(np.arange(len(counts)), counts)
        sums = np.stack(
            [np.bincount(sample, weights=vecs[:, j], minlength=len(counts)) for j in range(HIDDEN_DIM)], 1
        )
        return sums / np.maximum(counts, 1)[:, None]

    def _raw_logits(self, f: np.ndarray) -> np.ndarray:
        """Unscaled per-task logits of the hidden feature vectors ``f``: ``tanh(f) @ W``."""
        return np.tanh(f) @ self._w_task


def _offsets(counts: np.ndarray) -> np.ndarray:
    return np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
