"""Synthetic batches follow the scenario; bad batches fail with a one-line error naming the table."""

import numpy as np
import pytest
import torch

import scenarios
from executor.data import SyntheticData, zipf_ids
from executor.parallelize import build


@pytest.fixture
def scenario():
    return scenarios.load("debug-cpu")


@pytest.fixture
def batch(scenario):
    return SyntheticData(scenario, 0).batch(8)


def test_batch_follows_the_scenario(scenario):
    b = next(SyntheticData(scenario, 0))
    assert b.size == scenario.training.micro_batch == 128
    assert b.dense.shape == (128, 8) and b.labels.shape == (128, 2)
    assert set(b.pooled) == {"user_0", "user_1", "user_2", "ad_0", "ad_1"}
    counts = b.pooled["user_0"][1].diff()
    assert counts.min() >= 2 and counts.max() <= 4  # uniform on [2*3-4, 4]
    h = b.sequences["history"]
    assert 8 <= int(h.lengths.min()) and int(h.lengths.max()) <= 24
    assert set(h.ids) == {"item", "action"} and len(h.ids["item"]) == int(h.lengths.sum())
    b.validate(scenario.model)


def test_same_seed_same_data_and_eval_stream_differs(scenario):
    a, b = SyntheticData(scenario, 3).batch(4), SyntheticData(scenario, 3).batch(4)
    assert torch.equal(a.dense, b.dense) and torch.equal(a.labels, b.labels)
    e = SyntheticData(scenario, 3, split="eval").batch(4)
    assert not torch.equal(a.dense, e.dense)


def test_zipf_ids_are_skewed_and_in_range():
    rng = np.random.default_rng(0)
    ids = zipf_ids(rng, 20000, 1000, 1.1)
    assert ids.min() >= 0 and ids.max() < 1000
    assert (ids < 10).mean() > 0.3  # the head is popular
    uniform = zipf_ids(rng, 20000, 1000, 0.0)
    assert abs((uniform < 10).mean() - 0.01) < 0.005


def _bad(batch, what):
    if what == "id":
        v, o = batch.pooled["user_1"]
        v[0] = 500
    elif what == "negative":
        v, o = batch.pooled["ad_0"]
        v[0] = -1
    elif what == "offsets":
        v, o = batch.pooled["ad_1"]
        batch.pooled["ad_1"] = (v[:-1], o)
    elif what == "length":
        batch.sequences["history"].lengths[2] = -3
    elif what == "too_long":
        batch.sequences["history"].lengths[1] = 10_000
    elif what == "seq_offsets":
        batch.sequences["history"].offsets[1] += 1
    elif what == "seq_ids":
        h = batch.sequences["history"]
        h.ids["action"] = h.ids["action"][:-1]
    elif what == "seq_range":
        batch.sequences["history"].ids["action"][0] = 8
    elif what == "missing":
        del batch.pooled["user_2"]
    elif what == "dense":
        batch.dense = batch.dense[:, :7]
    elif what == "dense_nan":
        batch.dense[3, 1] = float("nan")
    elif what == "float_ids":
        v, o = batch.pooled["user_0"]
        batch.pooled["user_0"] = (v.float(), o)
    elif what == "label":
        batch.labels[5, 1] = 2.0
    return batch


MESSAGES = {
    "id": r"^batch.pooled\['user_1'\]: id 500 out of range \[0, 500\) for a table of 500 rows; "
          r"hash or clip ids into the table$",
    "negative": r"^batch.pooled\['ad_0'\]: id -1 out of range \[0, 300\)",
    "offsets": r"^batch.pooled\['ad_1'\]: offsets do not add up: they must start at 0, never decrease "
               r"and end at len\(values\) = 7 \(got first 0, last 8\)$",
    "length": r"^batch.sequences\['history'\]: negative length -3 at sample 2; lengths must be >= 0$",
    "too_long": r"^batch.sequences\['history'\]: length 10000 at sample 1 exceeds the scenario's length.max = \d+; "
                r"truncate the sequence or raise length.max$",
    "seq_offsets": r"^batch.sequences\['history'\]: offsets do not add up",
    "seq_ids": r"^batch.sequences\['history'\].ids\['action'\]: has \d+ ids, but the lengths add up to \d+",
    "seq_range": r"^batch.sequences\['history'\].ids\['action'\]: id 8 out of range \[0, 8\)",
    "missing": r"^batch.pooled is missing table 'user_2'",
    "dense": r"^batch.dense: shape \(8, 7\), expected \(B, 8\) for model.dense_features = 8$",
    "dense_nan": r"^batch.dense: dtype torch.float32 with non-finite or non-float values; pass finite floats",
    "float_ids": r"^batch.pooled\['user_0'\] values: dtype torch.float32; ids, lengths and offsets must be integers",
    "label": r"^batch.labels: value 2.0 at sample 5, task 1; labels must be in \[0, 1\]$",
}


@pytest.mark.parametrize("what", list(MESSAGES))
def test_bad_batch_is_one_line_error_naming_the_table(scenario, batch, what):
    model = build(scenario)
    with pytest.raises(ValueError, match=MESSAGES[what]) as e:
        model(_bad(batch, what))
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("processes", [False, True])
@pytest.mark.parametrize("what", ["id", "length", "seq_offsets", "float_ids"])
def test_prefetcher_rejects_bad_data_before_the_model(scenario, batch, what, processes):
    """In the calling thread or in the worker process alike: the one-line ValueError."""
    from executor.data import Prefetcher

    loader = Prefetcher(iter([_bad(batch, what)]), scenario.model, "cpu", processes=processes)
    with pytest.raises(ValueError, match=MESSAGES[what]) as e:
        next(loader)
    assert "\n" not in str(e.value)
    loader.close()


def test_validation_runs_once_and_survives_to(scenario, batch):
    batch.validate(scenario.model)
    assert batch.validated_for is scenario.model
    moved = batch.to("cpu")
    assert moved.validated_for is scenario.model
    moved.pooled["user_1"][0][0] = 10**6  # a later change is not re-checked: validate on the host, once
    moved.validate(scenario.model)
    other = scenarios.load("debug-cpu")
    with pytest.raises(ValueError, match="id 1000000 out of range"):
        moved.validate(other.model)  # another model: checked again


def test_packed_layouts_match_the_tables(scenario, batch):
    from executor.data import pooled_table_groups, sequence_table_groups

    groups = pooled_table_groups(scenario.model.embeddings)
    assert [(g.dim, g.names) for g in groups] == [(32, ("user_0", "user_1", "user_2")), (16, ("ad_0", "ad_1"))]
    batch.pack(scenario.model)
    indices, offsets = batch.pooled_packed(groups[0])
    B = batch.size
    for t, name in enumerate(groups[0].names):
        values, offs = batch.pooled[name]
        for b in range(B):
            assert torch.equal(indices[offsets[t * B + b]:offsets[t * B + b + 1]], values[offs[b]:offs[b + 1]])
    seq = sequence_table_groups(scenario.model.embeddings.sequences[0])
    assert [(g.dim, g.names, g.cols) for g in seq] == [(32, ("item",), (0,)), (8, ("action",), (32,))]
    ids = batch.sequence_packed("history", seq[1])
    assert torch.equal(ids[0], batch.sequences["history"].ids["action"])
    pinned = batch.to("cpu")
    assert set(pinned.packed) == set(batch.packed)


@pytest.mark.parametrize("processes", [False, True])
def test_prefetcher_on_cpu_yields_the_source_batches(scenario, processes):
    """The same batches in the same order, drawn here or in a worker process (packed there, and
    marked validated for this model so the model does not check them again)."""
    from executor.data import Prefetcher

    loader = Prefetcher(SyntheticData(scenario, 5), scenario.model, "cpu", processes=processes)
    direct = SyntheticData(scenario, 5)
    for _ in range(3):
        a, b = next(loader), next(direct)
        assert a.validated_for is scenario.model
        for x, y in zip(a.tensors(), b.pack(scenario.model).tensors()):
            assert torch.equal(x, y)
        assert bool(a.packed) == processes  # packed in the worker
    loader.close()


def test_static_shape_batches_pad_their_id_layouts(scenario):
    """``Prefetcher(bucket=…)`` packs static-shape batches: every packed id layout is padded with
    id 0 to a multiple of the bucket, the bags' offsets and the raw ids stay as drawn."""
    from executor.data import Prefetcher, pooled_table_groups, sequence_table_groups

    bucket = 64
    loader = Prefetcher(SyntheticData(scenario, 5), scenario.model, "cpu", bucket=bucket)
    direct = SyntheticData(scenario, 5)
    for _ in range(2):
        a, b = next(loader), next(direct).pack(scenario.model)
        assert a.bucket == bucket
        for g in pooled_table_groups(scenario.model.embeddings):
            (idx, off), (idx0, off0) = a.pooled_packed(g), b.pooled_packed(g)
            assert idx.numel() % bucket == 0 and idx.numel() - idx0.numel() in range(bucket)
            assert torch.equal(off, off0) and torch.equal(idx[: idx0.numel()], idx0) and not idx[idx0.numel():].any()
        for sg in scenario.model.embeddings.sequences:
            for g in sequence_table_groups(sg):
                ids, ids0 = a.sequence_packed(sg.name, g), b.sequence_packed(sg.name, g)
                assert ids.shape[1] % bucket == 0 and ids.shape[1] - ids0.shape[1] in range(bucket)
                assert torch.equal(ids[:, : ids0.shape[1]], ids0) and not ids[:, ids0.shape[1]:].any()
    loader.close()


@pytest.mark.gpu
def test_prefetcher_copies_to_the_gpu_off_the_critical_path(scenario):
    from executor.data import Prefetcher

    loader = Prefetcher(SyntheticData(scenario, 5), scenario.model, "cuda", depth=2)
    direct = SyntheticData(scenario, 5)
    for _ in range(3):
        a, b = next(loader), next(direct)
        assert a.dense.is_cuda and a.validated_for is scenario.model and a.packed
        for x, y in zip(a.tensors(), b.pack(scenario.model).tensors()):
            assert torch.equal(x.cpu(), y)
    loader.close()
    bad = SyntheticData(scenario, 5).batch(8)
    bad.pooled["user_1"][0][0] = 500
    with pytest.raises(ValueError, match=MESSAGES["id"]):
        next(Prefetcher(iter([bad]), scenario.model, "cuda"))
