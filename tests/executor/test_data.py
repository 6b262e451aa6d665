"""Synthetic batches follow the scenario; bad batches fail with a one-line error naming the table."""

import numpy as np
import pytest
import torch

import scenarios
from executor.data import SyntheticData, zipf_ids
from executor.model import build_model


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
    return batch


MESSAGES = {
    "id": r"^batch.pooled\['user_1'\]: id 500 out of range \[0, 500\) for a table of 500 rows$",
    "negative": r"^batch.pooled\['ad_0'\]: id -1 out of range \[0, 300\)",
    "offsets": r"^batch.pooled\['ad_1'\]: offsets do not add up: they must start at 0, never decrease "
               r"and end at len\(values\) = 7 \(got first 0, last 8\)$",
    "length": r"^batch.sequences\['history'\]: negative length -3 at sample 2$",
    "seq_offsets": r"^batch.sequences\['history'\]: offsets do not add up",
    "seq_ids": r"^batch.sequences\['history'\].ids\['action'\]: has \d+ ids, but the lengths add up to \d+",
    "seq_range": r"^batch.sequences\['history'\].ids\['action'\]: id 8 out of range \[0, 8\)",
    "missing": r"^batch.pooled is missing table 'user_2'",
    "dense": r"^batch.dense: shape \(8, 7\), expected \(B, 8\) for model.dense_features = 8$",
}


@pytest.mark.parametrize("what", list(MESSAGES))
def test_bad_batch_is_one_line_error_naming_the_table(scenario, batch, what):
    model = build_model(scenario)
    with pytest.raises(ValueError, match=MESSAGES[what]) as e:
        model(_bad(batch, what))
    assert "\n" not in str(e.value)
