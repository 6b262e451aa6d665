"""Evaluation metrics in torch: rank-based AUC (ties share their average rank) and NE."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor


def auc(scores: Tensor, labels: Tensor) -> float:
    """Area under the ROC curve = P(score of a random positive > score of a random negative).

    Mann-Whitney: ``(Σ ranks of positives - P(P+1)/2) / (P·N)`` with 1-based ranks, ties given
    their average rank (so a tie counts 1/2). NaN when one class is absent.
    """
    s, y = scores.detach().double().flatten(), labels.flatten() > 0.5
    pos = int(y.sum())
    neg = len(y) - pos
    if pos == 0 or neg == 0:
        return math.nan
    _, inverse, counts = torch.unique(s, return_inverse=True, return_counts=True)
    start = torch.cumsum(counts, 0) - counts  # ranks before each distinct value
    avg_rank = start.double() + (counts.double() + 1) / 2
    rank_sum = float(avg_rank[inverse][y].sum())
    return (rank_sum - pos * (pos + 1) / 2) / (pos * neg)


def normalized_entropy(logits: Tensor, labels: Tensor) -> float:
    """NE = mean BCE of the predictions / entropy of the base rate (1.0 = predicting the rate)."""
    y = labels.detach().double().flatten()
    p = float(y.mean())
    if p <= 0.0 or p >= 1.0:
        return math.nan
    bce = float(F.binary_cross_entropy_with_logits(logits.detach().double().flatten(), y))
    return bce / -(p * math.log(p) + (1 - p) * math.log(1 - p))
