"""Integer length distributions: sequence lengths and pooling factors (ids per bag).

One type serves both. A distribution is given the way people describe production traffic —
a maximum, a mean and a shape — and is turned into an exact probability mass function over
``0..max`` so that the twin can take exact expectations (``E[L]``, ``E[L^2]``, the expected
number of attention blocks) and the executor can sample from the very same law.
"""

from __future__ import annotations

import math
from functools import lru_cache
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator


class LengthDist(BaseModel):
    """Lengths on ``min..max``.

    - ``fixed``: every length is ``max`` (``mean`` must be absent or equal ``max``).
    - ``uniform``: integers uniform on ``[2*mean - max, max]``; "uniform in [L/2, L]" is
      ``max=L, mean=0.75*L``.
    - ``lognormal``: a log-normal with log-space std ``sigma``, discretised to integers and
      clipped to ``[min, max]`` (mass beyond the ends lands on the ends); its location is
      solved so that the clipped mean equals ``mean``.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    shape: Literal["fixed", "uniform", "lognormal"] = Field(
        "fixed", description="Shape of the distribution: fixed | uniform | lognormal."
    )
    max: int = Field(..., ge=0, description="Largest length (inclusive).")
    mean: float | None = Field(
        None, ge=0, description="Mean length; required for uniform and lognormal."
    )
    min: int = Field(0, ge=0, description="Smallest length (lognormal only; uniform derives it).")
    sigma: float = Field(1.0, gt=0, description="Log-space standard deviation (lognormal only).")

    @model_validator(mode="after")
    def _check(self) -> LengthDist:
        if self.shape == "fixed":
            if self.mean is not None and self.mean != self.max:
                raise ValueError(
                    f"mean ({self.mean}) must equal max ({self.max}) for shape 'fixed'; "
                    "drop mean or pick shape 'uniform' or 'lognormal'"
                )
            return self
        if self.mean is None:
            raise ValueError(f"mean is required for shape '{self.shape}'")
        if self.shape == "uniform" and not (self.max / 2 <= self.mean <= self.max):
            raise ValueError(
                f"mean ({self.mean}) must lie in [max/2, max] = [{self.max / 2}, {self.max}] "
                "for shape 'uniform' (lengths are uniform on [2*mean-max, max])"
            )
        if self.shape == "lognormal" and not (self.min < self.mean < self.max):
            raise ValueError(
                f"mean ({self.mean}) must lie strictly between min ({self.min}) and "
                f"max ({self.max}) for shape 'lognormal'"
            )
        return self

    # ---- exact law -------------------------------------------------------------------------
    @property
    def pmf(self) -> np.ndarray:
        """Probabilities of lengths ``0..max`` (sums to 1; read-only, computed once per law).

        Cached outside the instance, so that two equal laws still compare equal (an array in
        the model's ``__dict__`` would make ``==`` raise)."""
        return _pmf(self.shape, self.max, self.mean, self.min, self.sigma)

    def expect(self, f) -> float:
        """E[f(L)] for a vectorised function ``f`` of the integer length."""
        lengths = np.arange(self.max + 1, dtype=np.float64)
        return float(np.dot(self.pmf, f(lengths)))

    @property
    def expected(self) -> float:
        """E[L]."""
        return self.expect(lambda n: n)

    @property
    def expected_sq(self) -> float:
        """E[L^2] — what softmax attention over a jagged sequence costs."""
        return self.expect(lambda n: n * n)

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """``n`` lengths drawn from this law with ``rng``."""
        return rng.choice(self.max + 1, size=n, p=self.pmf).astype(np.int64)


@lru_cache(maxsize=1024)
def _pmf(shape: str, hi: int, mean: float | None, lo: int, sigma: float) -> np.ndarray:
    p = np.zeros(hi + 1)
    if shape == "fixed":
        p[hi] = 1.0
    elif shape == "uniform":
        low = int(round(2 * mean - hi))
        p[low : hi + 1] = 1.0 / (hi + 1 - low)
    else:
        p = _lognormal_pmf(mean, sigma, lo, hi)
    p.setflags(write=False)
    return p


def _erf(x: np.ndarray) -> np.ndarray:
    """Vectorised erf (Abramowitz & Stegun 7.1.26, |error| < 1.5e-7)."""
    t = 1.0 / (1.0 + 0.3275911 * np.abs(x))
    poly = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429))))
    return np.sign(x) * (1.0 - poly * np.exp(-x * x))


def _clipped_lognormal(mu: float, sigma: float, lo: int, hi: int) -> np.ndarray:
    edges = np.arange(lo, hi, dtype=np.float64) + 0.5  # boundaries between integers lo..hi
    z = (np.log(edges) - mu) / (sigma * math.sqrt(2.0))
    cdf = 0.5 * (1.0 + _erf(z))
    p = np.diff(np.concatenate(([0.0], cdf, [1.0])))
    full = np.zeros(hi + 1)
    full[lo : hi + 1] = p
    return full


def _lognormal_pmf(mean: float, sigma: float, lo: int, hi: int) -> np.ndarray:
    lengths = np.arange(hi + 1, dtype=np.float64)
    a, b = -20.0, math.log(hi) + 10 * sigma
    for _ in range(60):  # bisection on mu: the clipped mean is increasing in mu
        mid = 0.5 * (a + b)
        if float(np.dot(_clipped_lognormal(mid, sigma, lo, hi), lengths)) < mean:
            a = mid
        else:
            b = mid
    return _clipped_lognormal(0.5 * (a + b), sigma, lo, hi)


# ---- embedding ids ---------------------------------------------------------------------------------
# The executor draws a table's ids from a power law (``executor.data.zipf_ids``): ``id = floor(x) - 1``
# with ``x`` on ``[1, rows + 1)`` of density ∝ ``x^-skew`` (uniform when skew is 0), so the lowest
# ids are the hottest. The twin takes the same law's expectations from here.
def id_cdf(x: np.ndarray, rows: int, skew: float) -> np.ndarray:
    """P(X < x) of the power law behind a table's ids (id i covers x in [i + 1, i + 2))."""
    top = float(rows + 1)
    if skew == 0:
        return (x - 1.0) / (top - 1.0)
    if abs(skew - 1.0) < 1e-6:
        return np.log(x) / np.log(top)
    e = 1.0 - skew
    return (x**e - 1.0) / (top**e - 1.0)


def id_shares(rows: int, skew: float, k: int, *, start: int = 0) -> np.ndarray:
    """Shares of lookups of a table's ids ``start .. start + k - 1`` (the ``k`` hottest from ``start``)."""
    k = max(0, min(k, rows - start))
    return np.diff(id_cdf(np.arange(start + 1, start + k + 2, dtype=np.float64), rows, skew))


def expected_unique_ids(rows: int, skew: float, draws: float, *, exact: int = 4096, bins: int = 512) -> float:
    """Expected distinct ids among ``draws`` ids of one table: ``Σ_i 1 - (1 - p_i)^draws``, exact over
    the ``exact`` hottest ids and over log-spaced bins of the rest (p varies little inside one); within
    0.3% of the counts of the H200 lookup sweep (hwmodels/data/measured/lookup_sweep_h200_*.json)."""
    if draws <= 0 or rows <= 0:
        return 0.0
    p = np.minimum(id_shares(rows, skew, exact), 1.0 - 1e-16)
    unique = float(-np.expm1(draws * np.log1p(-p)).sum())
    k = min(rows, exact)
    if rows > k:
        edges = np.unique(np.geomspace(k, rows, bins + 1).round())
        width = np.diff(edges)
        mean_p = np.minimum(np.diff(id_cdf(edges + 1.0, rows, skew)) / width, 1.0 - 1e-16)
        unique += float((width * -np.expm1(draws * np.log1p(-mean_p))).sum())
    return min(unique, float(rows), float(draws))
