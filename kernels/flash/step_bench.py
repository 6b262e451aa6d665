"""The attention of one training step at a scenario's own shapes, per op and per tile configuration.

``gpu_check`` times the core at B=1152 over length ranges; this times what ``gemtwin train``
runs: for gem-h200-1gpu, per step, 4 GDPA self attentions (causal, silu, jagged lengths drawn
from the scenario's length law at its micro-batch) and 2 cross layers, each with both directions
(sequence tokens over the N non-sequence tokens, and the N non-sequence tokens over the
sequence). Each op goes through the family's packed entry (``kernels.attention.dispatch.
attention_packed``, which the executor's attention module calls: fused projections in, recompute
as the scenario's checkpointing says), forward alone and forward + backward, each captured as a
CUDA graph (as the training step runs: no host time between kernels; the work lists rebuilt in
each capture, as in a training step's graph) and timed by ``triton.testing.do_bench`` (median
of replays, ``kernels.common.timing.replay_ms``), for the core's table tiles ("table") and every
variant of ``VARIANTS`` (``FlashOptions(tiles=...)``). Before timing, worker processes run every
(op, variant) once so that Triton's on-disk cache is warm (``--workers``). Every variant's
outputs and gradients are compared with the table's (max abs diff over the output scale, must be
< 2e-2).

    python -m kernels.flash.step_bench [--scenario gem-h200-1gpu] [--workers 8] [--mxfp8] [--out DIR]

Writes ``step_bench.json`` (per op and variant: forward and forward+backward ms, the diff) and
prints, per op, the best variant and the per-step total (ms x ops per step) with table tiles and
with each op's best variant.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np
import torch

from kernels.flash.options import Config, FlashOptions, Tiles

T = Tiles
# name -> Config (forward, dK/dV, dQ tiles; Tiles: own rows, other rows, warps, stages).
# Forward / dQ "own" rows are query rows; dK/dV's are key rows.
VARIANTS = {
    "f128x64": Config(T(128, 64, 8, 3), T(128, 64, 8, 3), T(128, 64, 8, 3)),
    "f64x128s2": Config(T(64, 128, 4, 2), T(128, 64, 8, 3), T(128, 64, 8, 3)),
    "f32x64": Config(T(32, 64, 4, 3), T(128, 64, 8, 3), T(128, 64, 8, 3)),
    "b64x64w4": Config(T(64, 64, 4, 3), T(64, 64, 4, 3), T(64, 64, 4, 3)),
    "b128x64s2": Config(T(64, 64, 4, 3), T(128, 64, 8, 2), T(128, 64, 8, 2)),
    "b64x128w8s2": Config(T(64, 64, 4, 3), T(64, 128, 8, 2), T(64, 128, 8, 2)),
    "b128x32w8s3": Config(T(64, 64, 4, 3), T(128, 32, 8, 3), T(128, 32, 8, 3)),
    "b32own": Config(T(32, 64, 4, 3), T(32, 64, 4, 3), T(32, 64, 4, 3)),
    "b64x32w4": Config(T(64, 32, 4, 3), T(64, 32, 4, 3), T(64, 32, 4, 3)),
    "b64x32w4s4": Config(T(64, 32, 4, 3), T(64, 32, 4, 4), T(64, 32, 4, 4)),
    "b64x32w4+f64x64": Config(T(64, 64, 4, 3), T(64, 32, 4, 3), T(64, 32, 4, 3)),
    "b64x32w4+dq128x64": Config(T(64, 32, 4, 3), T(64, 32, 4, 3), T(128, 64, 8, 3)),
    # 8 warps for dK/dV's 64x32 tiles: its two [64, 128] fp32 accumulators take 128 registers a
    # thread at 4 warps (254 in all; sm_90 compile, 2026-11-30), 64 at 8 (186)
    "b64x32+dkdv_w8": Config(T(64, 32, 4, 3), T(64, 32, 8, 3), T(64, 32, 4, 3)),
    # dQ by fp32 atomics inside the dK/dV pass: 5 matmuls per tile pair instead of 4 + 3. Slower at
    # 128-row tiles, where it spilled (kernels/flash/NOTES.md); at 64x32 it spills with 4 warps
    # (255 registers) but not with 8 (224; 212 at 2 stages)
    "b64x32w8+atomic": Config(T(64, 32, 4, 3), T(64, 32, 8, 3), T(64, 32, 4, 3), atomic_dq=True),
    "b64x32w8s2+atomic": Config(T(64, 32, 4, 3), T(64, 32, 8, 2), T(64, 32, 4, 3), atomic_dq=True),
    # the cross attention's backward in one kernel per (sample, head) (``Config.fused_short``);
    # the other kernels keep the table's 64x32 tiles. Tiles: long-side rows, -, warps, stages
    "short32w4s2": Config(T(64, 32, 4, 3), T(64, 32, 4, 3), T(64, 32, 4, 3), fused_short=T(32, 0, 4, 2)),
    "short32w4s3": Config(T(64, 32, 4, 3), T(64, 32, 4, 3), T(64, 32, 4, 3), fused_short=T(32, 0, 4, 3)),
    "short64w8s2": Config(T(64, 32, 4, 3), T(64, 32, 4, 3), T(64, 32, 4, 3), fused_short=T(64, 0, 8, 2)),
}


def parse(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--scenario", default="gem-h200-1gpu")
    p.add_argument("--workers", type=int, default=8, help="processes that compile the variants first (0: none)")
    p.add_argument("--variants", default="", help="comma-separated subset of VARIANTS (default: all)")
    p.add_argument("--mxfp8", action="store_true", help="also time the MXFP8 GDPA (flash kernels vs padded emulation)")
    p.add_argument("--out", default=os.environ.get("OUT", "."))
    p.add_argument("--warm", nargs=2, type=int, metavar=("I", "N"), help=argparse.SUPPRESS)
    return p.parse_args(argv)


def ops(scenario_name: str, device: str = "cuda", mxfp8: bool = False):
    """``{name: (count per step, make)}`` and the batch's description: ``make()`` returns ``(run,
    inputs)`` where ``run(*inputs, flash=...)`` is the op as the model calls it. ``mxfp8`` (GDPA
    scenarios): also the MXFP8 GDPA on the flash kernels and its padded emulation
    (``kernels.mxfp8.gdpa``; names in ``MXFP8_OPS``; table tiles only)."""
    import scenarios
    from kernels.attention.dispatch import attention_packed
    from kernels.attention.spec import AttentionSpec

    s = scenarios.load(scenario_name)
    m = s.model
    c, x = m.sequence, m.cross
    B, N = s.training.micro_batch, m.nonseq.num_tokens
    (group,) = m.embeddings.sequences  # one sequence group (the GEM scenarios')
    max_len = group.length.max
    lengths = torch.from_numpy(group.length.sample(np.random.default_rng(0), B).astype(np.int64))
    offsets = torch.zeros(B + 1, dtype=torch.int64)
    offsets[1:] = torch.cumsum(lengths, 0)
    rows = int(offsets[-1])
    offsets = offsets.to(device)
    recompute = s.parallelism.activation_checkpointing == "selective"
    dt = torch.bfloat16
    g = torch.Generator(device=device).manual_seed(0)

    def rnd(*shape):
        return (torch.randn(*shape, generator=g, device=device, dtype=torch.float32) * 0.5).to(dt).requires_grad_()

    def packed(spec, a, b=None, flash=None):
        return attention_packed(a, b, offsets, max_len, spec=spec, flash=flash, recompute=recompute)

    out = {}
    if m.sequence.num_layers:
        spec = AttentionSpec(c.attention, causal=c.causal, activation=c.gdpa_activation,
                             block=c.block_size if c.attention == "block" else 0)
        out[f"self {c.attention} causal={c.causal} H={c.heads} D={c.head_dim}"] = (
            c.num_layers, lambda: (lambda qkv, flash=None: packed(spec, qkv, flash=flash),
                                   (rnd(rows, 3, c.heads, c.head_dim),)))
    if x.num_layers:
        seq, nonseq = AttentionSpec("asym", jagged="q"), AttentionSpec("asym", jagged="kv")
        out[f"cross seq<-nonseq (q jagged, N={N})"] = (x.num_layers, lambda: (
            lambda q, kv, flash=None: packed(seq, q, kv, flash),
            (rnd(rows, x.heads, x.head_dim), rnd(B, N, 2, x.heads, x.head_dim))))
        out[f"cross nonseq<-seq (kv jagged, N={N})"] = (x.num_layers, lambda: (
            lambda q, kv, flash=None: packed(nonseq, q, kv, flash),
            (rnd(B, N, x.heads, x.head_dim), rnd(rows, 2, x.heads, x.head_dim))))
    if mxfp8 and m.sequence.num_layers and c.attention == "gdpa":
        from kernels.mxfp8.gdpa import gdpa_mxfp8

        for name, tri in ((MXFP8_OPS[0], True), (MXFP8_OPS[1], False)):
            out[name] = (c.num_layers, lambda tri=tri: (lambda q, k, v, flash=None: gdpa_mxfp8(
                q, k, v, offsets, causal=c.causal, activation=c.gdpa_activation, max_len=max_len, triton=tri),
                tuple(rnd(rows, c.heads, c.head_dim) for _ in range(3))))
    meta = dict(scenario=s.name, batch=B, rows=rows, mean_len=rows / B, max_len=max_len, recompute=recompute)
    return out, meta, offsets


# MXFP8 GDPA ops (--mxfp8): table tiles only; the padded emulation syncs with the host (no graph)
MXFP8_OPS = ("self gdpa MXFP8, flash kernels", "self gdpa MXFP8, padded emulation")


def _variants(args, op: str = "") -> dict[str, FlashOptions]:
    """The core's options of each variant timed for ``op``: the table's, then ``VARIANTS``'."""
    if op in MXFP8_OPS:
        return {"table": FlashOptions()}
    names = [v for v in args.variants.split(",") if v] or list(VARIANTS)
    unknown = [v for v in names if v not in VARIANTS]
    if unknown:
        raise SystemExit(f"error: --variants {','.join(unknown)}: unknown; known: {', '.join(VARIANTS)}")
    return {"table": FlashOptions()} | {v: FlashOptions(tiles=VARIANTS[v]) for v in names}


def _call(run, inputs, flash, backward: bool, grad=None):
    o = run(*inputs, flash=flash)
    if backward:
        o.backward(grad)
    return o


def _grads(run, inputs, flash, gout):
    """Gradients of ``run(*inputs)``, on fresh leaves (the inputs' own autograd nodes were made on
    another stream by the eager checks; reusing them breaks a capture)."""
    leaves = [t.detach().requires_grad_() for t in inputs]
    return torch.autograd.grad(run(*leaves, flash=flash), leaves, gout)


def _graph_ms(offsets, fn) -> float:
    """Median ms of ``fn`` replayed from a CUDA graph (as the training step runs it). The work
    lists cached on ``offsets`` are dropped around the capture, so that the graph builds its own,
    as a training step's graph does (``kernels/flash/work.py``)."""
    from kernels.common.timing import replay_ms
    from kernels.flash.work import WorkCache

    with WorkCache.of(offsets).scope():
        return replay_ms(fn)


def _eager_ms(offsets, fn) -> float:
    """Median ms of ``fn`` launched eagerly (ops that sync with the host cannot be captured)."""
    import triton

    return triton.testing.do_bench(fn, warmup=25, rep=150, return_mode="median")


def warm(args) -> None:
    """Worker ``I`` of ``N``: run its share of (op, variant) pairs once, forward and backward, so
    that the parent finds every kernel compiled (Triton's cache is shared between processes)."""
    i, n = args.warm
    table, _, _ = ops(args.scenario, mxfp8=args.mxfp8)
    jobs = [(op, v, flash) for op in table for v, flash in _variants(args, op).items()]
    for op, v, flash in jobs[i::n]:
        run, inputs = table[op][1]()
        try:
            o = _call(run, inputs, flash, False)
            _call(run, inputs, flash, True, torch.ones_like(o))
            torch.cuda.synchronize()
        except Exception as e:  # noqa: BLE001 - reported, timed as failed by the parent
            print(f"warm {op} {v}: {type(e).__name__}: {e}", flush=True)


def main(argv=None) -> dict:
    args = parse(argv)
    if args.warm:
        warm(args)
        return {}
    import triton

    t0 = time.time()
    if args.workers:
        cmd = [sys.executable, "-m", "kernels.flash.step_bench", "--scenario", args.scenario,
               "--variants", args.variants] + (["--mxfp8"] if args.mxfp8 else [])
        procs = [subprocess.Popen(cmd + ["--warm", str(i), str(args.workers)]) for i in range(args.workers)]
        for p in procs:
            p.wait()
        print(f"compiled in {time.time() - t0:.0f} s", flush=True)
    table, meta, offsets = ops(args.scenario, mxfp8=args.mxfp8)
    result = dict(meta=meta, device=torch.cuda.get_device_name(), torch=torch.__version__,
                  triton=triton.__version__, ops={})
    for op, (count, make) in table.items():
        run, inputs = make()
        ref = _call(run, inputs, FlashOptions(), False).detach()
        gout = torch.randn_like(ref)
        for t in inputs:
            t.grad = None
        _call(run, inputs, FlashOptions(), True, gout)
        ref_grads = [t.grad.clone() for t in inputs]
        rows = {}
        timer = _eager_ms if op == MXFP8_OPS[1] else _graph_ms
        for v, flash in _variants(args, op).items():
            try:
                for t in inputs:
                    t.grad = None
                o = _call(run, inputs, flash, True, gout)
                diff = max(_rel(o.detach(), ref), *(_rel(t.grad, r) for t, r in zip(inputs, ref_grads)))
                fwd = timer(offsets, lambda: _call(run, [t.detach().requires_grad_() for t in inputs], flash, False))
                both = timer(offsets, lambda: _grads(run, inputs, flash, gout))
                rows[v] = dict(fwd_ms=fwd, fwd_bwd_ms=both, bwd_ms=both - fwd, diff=diff, ok=diff < 2e-2)
            except Exception as e:  # noqa: BLE001 - a variant that fails to compile or run is reported
                rows[v] = dict(error=f"{type(e).__name__}: {str(e)[:300]}")
            r = rows[v]
            print(f"{op:45s} {v:12s} " + (f"fwd {r['fwd_ms']:7.3f} ms  fwd+bwd {r['fwd_bwd_ms']:7.3f} ms  "
                                           f"diff {r['diff']:.1e}{'' if r['ok'] else ' WRONG'}"
                                           if "error" not in r else r["error"]), flush=True)
        ok = {v: r for v, r in rows.items() if r.get("ok")}
        best = min(ok, key=lambda v: ok[v]["fwd_bwd_ms"]) if ok else None
        result["ops"][op] = dict(count=count, variants=rows, best=best)
    step = {op: o for op, o in result["ops"].items() if op not in MXFP8_OPS and o["best"]}  # the bf16 step's ops
    tab = sum(o["count"] * o["variants"]["table"]["fwd_bwd_ms"] for o in step.values())
    best = sum(o["count"] * o["variants"][o["best"]]["fwd_bwd_ms"] for o in step.values())
    result |= dict(step_ms_table=tab, step_ms_best=best)
    print(f"\nper step (count x fwd+bwd): table tiles {tab:.3f} ms; each op's best {best:.3f} ms")
    for op, o in result["ops"].items():
        if not o["best"]:
            continue
        t, b = o["variants"]["table"], o["variants"][o["best"]]
        print(f"  {o['count']} x {op}: table {t['fwd_ms']:.3f} + {t['bwd_ms']:.3f} ms; best {o['best']} "
              f"{b['fwd_ms']:.3f} + {b['bwd_ms']:.3f} ms")
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "step_bench.json"), "w") as f:
        json.dump(result, f, indent=1)
    print(f"total {time.time() - t0:.0f} s")
    return result


def _rel(a, b) -> float:
    return float((a.float() - b.float()).abs().max() / b.float().abs().max().clamp_min(1e-30))


if __name__ == "__main__":
    main()
