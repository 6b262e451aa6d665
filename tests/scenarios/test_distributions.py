from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scenarios import LengthDist


def test_uniform_half_to_full():
    d = LengthDist(shape="uniform", max=1024, mean=768)
    assert d.pmf.sum() == pytest.approx(1.0)
    assert d.pmf[512] > 0 and d.pmf[511] == 0
    assert d.expected == pytest.approx(768)
    n = np.arange(512, 1025)
    assert d.expected_sq == pytest.approx(np.mean(n.astype(float) ** 2))


def test_fixed():
    d = LengthDist(max=5)
    assert d.expected == 5 and d.expected_sq == 25


@given(mean=st.floats(2, 500), sigma=st.floats(0.2, 2.0))
@settings(max_examples=30, deadline=None)
def test_lognormal_hits_its_mean(mean, sigma):
    d = LengthDist(shape="lognormal", max=1000, mean=mean, sigma=sigma, min=1)
    assert d.pmf.sum() == pytest.approx(1.0)
    assert d.expected == pytest.approx(mean, rel=1e-3)
    assert d.pmf[0] == 0


def test_sampling_follows_the_law():
    d = LengthDist(shape="lognormal", max=256, mean=20, min=1)
    x = d.sample(np.random.default_rng(0), 20000)
    assert x.min() >= 1 and x.max() <= 256
    assert x.mean() == pytest.approx(20, rel=0.05)


def test_equal_scenarios_compare_equal_after_their_laws_were_used():
    import scenarios

    a, b = scenarios.load("gem-h200-1gpu"), scenarios.load("gem-h200-1gpu")
    seq = a.model.embeddings.sequences[0].length
    assert seq.expected > 0 and seq.pmf.sum() == pytest.approx(1.0)  # computed (and cached)
    assert a == b and a != scenarios.load("gem-h200-1gpu", ["training.seed=7"])
