"""Asymmetric attention: ``q_len`` queries each attend to all ``kv_len`` keys of their sample
(long jagged queries × a few keys, or a few queries × a long jagged history)."""

from __future__ import annotations


def pairs(q_len, kv_len):
    return q_len * kv_len
