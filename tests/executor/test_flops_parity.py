"""The model's matmuls, as FlopCounterMode sees them, equal MODEL.md's analytic count.

``reference_flops`` below is MODEL.md transcribed term by term (independent of twin/flops.py);
the last test holds the twin's own count, ``twin.flops.step_flops``, to the counter.
"""

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

import scenarios
from scenarios.loader import read_raw
from executor.data import SyntheticData
from executor.model import build_model, compute_loss
from twin import flops


def _mlp(B, d_in, widths, first_no_input_grad=False):
    total = 0
    for i, w in enumerate(widths):
        total += (4 if (i == 0 and first_no_input_grad) else 6) * B * d_in * w
        d_in = w
    return total, d_in


def _pairs(L, kind, causal, block):
    sizes = [min(block, L - s) for s in range(0, L, block)] if kind == "block" else [L]
    return sum(n * (n + 1) // 2 if causal else n * n for n in sizes)


def reference_flops(m, group_lengths: dict[str, list[int]], B: int) -> float:
    """fwd+bwd FLOPs of one micro-batch per MODEL.md (6mkn per matmul, 4mkn the first dense one)."""
    if m.kind == "dlrm":
        f, D = _mlp(B, m.dense_features, m.bottom_mlp, first_no_input_grad=True)
        T = sum(fam.count for fam in m.embeddings.pooled)
        if m.interaction == "dot":
            f += 6 * B * (T + 1) ** 2 * D
            top_in = D + T * (T + 1) // 2
        else:
            n = D * (T + 1)
            f += m.dcn_layers * 6 * B * 2 * n * m.dcn_rank
            top_in = n
        t, h = _mlp(B, top_in, m.top_mlp)
        return f + t + 6 * B * h * len(m.tasks.names)
    d, N, sq, ns, cr = m.d_model, m.nonseq.num_tokens, m.sequence, m.nonseq, m.cross
    lengths = [sum(ls) for ls in zip(*group_lengths.values())] if group_lengths else [0] * B
    SL = sum(lengths)
    f, _ = _mlp(B, m.dense_features, m.bottom_mlp, first_no_input_grad=True)
    f += sum(6 * B * fam.count * fam.dim * d for fam in m.embeddings.pooled if fam.dim != d)
    for g in m.embeddings.sequences:
        Dg = sum(fam.count * fam.dim for fam in g.tables)
        f += 6 * sum(group_lengths[g.name]) * Dg * d
    T0 = 1 + sum(fam.count for fam in m.embeddings.pooled)
    f += 6 * B * N * T0 * d
    hd = sq.heads * sq.head_dim
    pairs = sum(_pairs(L, sq.attention, sq.causal, sq.block_size) for L in lengths)
    seq_layer = 6 * SL * d * 3 * hd + 6 * SL * hd * d + 12 * pairs * hd + 2 * 6 * SL * d * sq.ffn_mult * d
    k, F_ = ns.fm_rank, ns.fm_tokens
    nonseq_layer = 6 * B * d * N * k * 2 + 6 * B * (N * k * ns.fm_mlp_hidden + ns.fm_mlp_hidden * F_ * d)
    nonseq_layer += 6 * B * (N - F_) * N * d
    if m.moe.num_experts:
        nonseq_layer += 6 * B * N * d * m.moe.num_experts + 6 * B * N * m.moe.top_k * 2 * d * m.moe.expert_hidden
    else:
        nonseq_layer += 6 * B * N * 2 * d * ns.ffn_hidden
    hc = cr.heads * cr.head_dim
    seq_from_x = 6 * SL * d * hc + 6 * B * N * d * 2 * hc + 12 * hc * SL * N + 6 * SL * hc * d
    x_from_seq = 6 * B * N * d * hc + 6 * SL * d * 2 * hc + 12 * hc * N * SL + 6 * B * N * hc * d
    cross = seq_from_x + x_from_seq
    f += sq.num_layers * seq_layer + ns.num_layers * nonseq_layer + cr.num_layers * cross
    z = d * N + (d if m.embeddings.sequences else 0)
    t, h = _mlp(B, z, m.tasks.mlp)
    return f + t + 6 * B * h * len(m.tasks.names)


def counted_flops(scenario, batch) -> int:
    model = build_model(scenario)
    with FlopCounterMode(display=False) as fc:
        logits, aux = model(batch)
        compute_loss(logits, batch.labels, aux).backward()
    return fc.get_total_flops()


def _batch(scenario, n=16):
    return SyntheticData(scenario, 0).batch(n)


def _group_lengths(batch):
    return {g: s.lengths.tolist() for g, s in batch.sequences.items()}


CASES = {
    "debug-cpu": [],
    "gdpa-noncausal": ["model.sequence.attention=gdpa", "model.sequence.causal=false"],
    "block-dense-ffn": ["model.sequence.attention=block", "model.sequence.block_size=5",
                        "model.moe.num_experts=0", "model.cross.num_layers=2"],
}


@pytest.mark.parametrize("case", list(CASES))
def test_gem_counter_matches_model_md(case):
    s = scenarios.load("debug-cpu", CASES[case])
    batch = _batch(s)
    expected = reference_flops(s.model, _group_lengths(batch), batch.size)
    assert counted_flops(s, batch) == pytest.approx(expected, rel=1e-9)


def test_two_sequence_groups_and_a_length_zero_sample():
    raw = read_raw("debug-cpu")
    raw["model"]["embeddings"]["sequences"].append(
        {"name": "clicks", "length": {"shape": "uniform", "max": 6, "mean": 3},
         "tables": [{"name": "ad_id", "rows": 50, "dim": 8}]}
    )
    s = scenarios.validate(raw)
    batch = _batch(s, 12)
    g = batch.sequences["history"]
    g.lengths[3] = 0  # sample 3 has no history tokens in group 0
    g.ids = {t: torch.cat([i[: g.offsets[3]], i[g.offsets[4]:]]) for t, i in g.ids.items()}
    g.offsets = torch.cat([g.lengths.new_zeros(1), torch.cumsum(g.lengths, 0)])
    expected = reference_flops(s.model, _group_lengths(batch), batch.size)
    assert counted_flops(s, batch) == pytest.approx(expected, rel=1e-9)


@pytest.mark.parametrize("interaction", ["dot", "dcnv2"])
def test_dlrm_counter_matches_model_md(interaction, tiny_dlrm):
    s = tiny_dlrm(interaction)
    batch = _batch(s)
    assert counted_flops(s, batch) == pytest.approx(reference_flops(s.model, {}, batch.size), rel=1e-9)


@pytest.mark.parametrize("case", list(CASES) + ["dlrm"])
def test_twin_step_flops_matches_counter(case, tiny_dlrm):
    s = tiny_dlrm("dot") if case == "dlrm" else scenarios.load("debug-cpu", CASES[case])
    batch = _batch(s)
    groups = [batch.sequences[g.name].lengths.tolist() for g in s.model.embeddings.sequences]
    analytic = flops.step_flops(s.model, batch=batch.size, group_lengths=groups)
    assert counted_flops(s, batch) == pytest.approx(analytic, rel=1e-9)  # issue: within 1%; it is exact


@pytest.mark.parametrize("name", ["debug-cpu", "gem-h200-1gpu"])
def test_twin_dense_parameter_count_equals_the_model(name):
    """The twin's FSDP traffic, optimizer and memory rest on this count."""
    s = scenarios.load(name)
    twin = sum(c.params for c in flops.model_costs(s.model, batch=1))
    with torch.device("meta"):
        model = build_model(s)
    dense = sum(p.numel() for n, p in model.named_parameters() if ".tables." not in n)
    assert twin == dense
