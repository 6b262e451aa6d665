"""What the executor's non-default execution choices cost on a GPU, for the twin (twin/execution_cost.py).

Run on the device (imports torch and executor/; nothing in hwmodels imports this file):

    python3 hwmodels/bench/execution_bench.py --only reference_attention --out $OUT/reference_attention_h200_DATE.json
    python3 hwmodels/bench/execution_bench.py --only launch,sparse_update --out $OUT/torch_embeddings_h200_DATE.json
    python3 hwmodels/bench/execution_bench.py --smoke --out /tmp/x.json      # CPU, toy sizes, checks the code

The two files under ``hwmodels/data/measured/`` (``reference_attention_h200_2026-12-02.json``,
``torch_embeddings_h200_2026-12-02.json``) are its output on the lent H200; ``python -m
hwmodels.bench.fit_execution`` fits ``hwmodels/data/execution.yaml``'s reference-attention
coefficients to the first. Output: ``device`` (its name), ``torch``, ``utc``, then ``cases`` (the
reference attention's, one row each) and one key per other part.

Parts (``--only a,b``):

- ``reference_attention``: ``executor.attention``'s padded reference (``kernel="reference"`` on CUDA:
  every sample padded to the batch's longest, masked, the scores recomputed in backward through
  ``torch.utils.checkpoint``) at gem-h200-1gpu's shapes (H=4, D=128, lengths uniform in [512, 1024],
  cross attention against N=32 dense tokens) and a few others; each case's forward and backward
  timed apart with CUDA events (the median of 3 after a warm-up), once more under an outer
  checkpoint (the executor's ``selective`` activation checkpointing), and one forward and one
  backward under ``torch.profiler`` for the kernels each launches (name, calls, device time).
  Self attention runs with autocast off on bf16 q, k, v (as ``executor.model._self_attention``);
  cross attention inside ``torch.autocast(bf16)`` (as ``CrossLayer`` calls it).
- ``launch``: the host time of one eager op on CUDA tensors (``x.add_(1)`` on one element, no
  autograd; and ``(x * w)`` forward + backward with autograd), the fastest of 5 loops of 2,000.
- ``sparse_update``: ``embedding_kernel: torch``'s lookups at gem-h200-1gpu's pooled tables (48
  ``F.embedding_bag`` calls, dim 128, 256 bags of 8 or 3 ids, 1M-row fp32 tables; ids uniform)
  and their sequence tables (``F.embedding`` on 195k ids, dims 128 and 32), forward, backward to
  sparse gradients, and ``executor.optim.RowWiseAdagrad``'s step over them (what the executor
  runs when the lookups are not the Triton kernels): CUDA-event and host times.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.utils.checkpoint import checkpoint  # noqa: E402

PARTS = ("reference_attention", "launch", "sparse_update")


def _sync(dev):
    if dev.type == "cuda":
        torch.cuda.synchronize()


def _timed(dev, fn) -> float:
    """Seconds of ``fn()`` on the device (CUDA events) or the host clock (CPU)."""
    if dev.type == "cuda":
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        return a.elapsed_time(b) * 1e-3
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def _kernels(dev, fn) -> list[list]:
    """The device kernels ``fn()`` launches, longest first: [name, calls, total seconds] (CPU: ops, self time)."""
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev.type == "cuda" else [])
    _sync(dev)
    with profile(activities=acts) as p:
        fn()
        _sync(dev)
    rows: dict[str, list[float]] = {}
    for e in p.events():
        if e.device_type != torch.autograd.DeviceType.CPU or e.is_async:
            continue
        if dev.type == "cuda":  # each GPU kernel once, under the op that launched it (as executor/profiling.py)
            for k in e.kernels:
                if k.duration > 0 and not (k.name == e.name and _spans_work(e)):
                    r = rows.setdefault(k.name, [0, 0.0])
                    r[0] += 1
                    r[1] += k.duration * 1e-6
        elif e.self_cpu_time_total > 0:
            r = rows.setdefault(e.name, [0, 0.0])
            r[0] += 1
            r[1] += e.self_cpu_time_total * 1e-6
    out = [[n[:90], c, t] for n, (c, t) in rows.items()]
    return sorted(out, key=lambda r: -r[2])


def _spans_work(e) -> bool:
    """Whether ops under ``e`` launched GPU work (``e`` is a range over them: its "kernel" is a mirror)."""
    return any(c.kernels or _spans_work(c) for c in e.cpu_children)


# ---- reference attention ------------------------------------------------------------------------
def _lengths(B: int, lo: int, hi: int, gen) -> torch.Tensor:
    return torch.randint(lo, hi + 1, (B,), generator=gen)


def _case(name, dev, *, B, lo, hi, H=4, D=128, kind="gdpa", causal=True, block=64, cross=None, N=32,
          max_len=None) -> dict:
    from executor.attention import cross_attention, jagged_attention

    gen = torch.Generator().manual_seed(0)
    lens = _lengths(B, lo, hi, gen)
    offsets = torch.cat([torch.zeros(1, dtype=torch.int64), torch.cumsum(lens, 0)]).to(dev)
    T = int(lens.sum())
    n = int(lens.max())
    bf = torch.bfloat16
    mk = lambda *shape: torch.randn(*shape, device=dev, dtype=bf, requires_grad=True)  # noqa: E731
    if cross is None:
        q, k, v = mk(T, H, D), mk(T, H, D), mk(T, H, D)

        def fwd():
            with torch.autocast(dev.type, enabled=False):
                return jagged_attention(q, k, v, offsets, kind=kind, causal=causal, block_size=block,
                                        activation="silu", max_len=max_len or hi, padded=True, kernel="reference")
        out_shape = (T, H, D)
    else:
        if cross == "q":
            q, k, v = mk(T, H, D), mk(B, N, H, D), mk(B, N, H, D)
            out_shape = (T, H, D)
        else:
            q, k, v = mk(B, N, H, D), mk(T, H, D), mk(T, H, D)
            out_shape = (B, N, H, D)

        def fwd():
            with torch.autocast(dev.type, dtype=bf):
                return cross_attention(q, k, v, offsets, jagged=cross, max_len=n, padded=True, kernel="reference")
    grad = torch.randn(*out_shape, device=dev, dtype=bf)
    inputs = (q, k, v)

    def clear():
        for t in inputs:
            t.grad = None

    def selective():  # the executor's selective checkpointing: an outer checkpoint around the call
        return checkpoint(lambda *_: fwd(), q, k, v, use_reentrant=False, preserve_rng_state=False)

    row = {"case": name, "B": B, "kind": kind if cross is None else f"cross_{cross}", "causal": causal,
           "tokens": T, "max_len": n, "sum_len_sq": float((lens.double() ** 2).sum()),
           "blocks": int(((lens + block - 1) // block).sum())}  # as fit_execution reads them
    fwd_s, bwd_s, sel_s = [], [], []
    for i in range(4):  # the first is a warm-up
        clear()
        holder = {}
        f = _timed(dev, lambda: holder.update(o=fwd()))
        b = _timed(dev, lambda: holder["o"].backward(grad))
        del holder
        clear()
        holder = {}
        s = _timed(dev, lambda: holder.update(o=selective())) + _timed(dev, lambda: holder["o"].backward(grad))
        del holder
        if i:
            fwd_s.append(f), bwd_s.append(b), sel_s.append(s)
    row |= {"fwd_s": statistics.median(fwd_s), "bwd_s": statistics.median(bwd_s),
            "selective_fwd_bwd_s": statistics.median(sel_s)}
    clear()
    holder = {}
    row["fwd_kernels"] = _kernels(dev, lambda: holder.update(o=fwd()))
    row["bwd_kernels"] = _kernels(dev, lambda: holder["o"].backward(grad))
    del holder
    clear()
    if dev.type == "cuda":
        row["peak_memory_bytes"] = torch.cuda.max_memory_allocated()
        torch.cuda.reset_peak_memory_stats()
    print(f"{name:40s} fwd {row['fwd_s'] * 1e3:8.3f} ms  bwd {row['bwd_s'] * 1e3:8.3f} ms  "
          f"selective {row['selective_fwd_bwd_s'] * 1e3:8.3f} ms  (T={T}, n={n})", flush=True)
    return row


def reference_attention(dev, smoke: bool) -> list[dict]:
    if smoke:
        cases = [("gdpa smoke", dict(B=4, lo=3, hi=9, H=2, D=8)),
                 ("jfa smoke", dict(B=4, lo=3, hi=9, H=2, D=8, kind="jfa")),
                 ("block smoke", dict(B=4, lo=3, hi=9, H=2, D=8, kind="jfa", block=4)),
                 ("cross q smoke", dict(B=4, lo=3, hi=9, H=2, D=8, cross="q", N=4)),
                 ("cross kv smoke", dict(B=4, lo=3, hi=9, H=2, D=8, cross="kv", N=4))]
    else:
        g = dict(lo=512, hi=1024)
        # lengths uniform in [512, 1024] (gem-h200-1gpu's) unless named; H=4, D=128, N=32 dense tokens
        cases = [("gdpa B256", dict(B=256, **g)),
                 ("gdpa B128", dict(B=128, **g)),
                 ("gdpa B256 L256-512", dict(B=256, lo=256, hi=512, max_len=512)),
                 ("jfa B256", dict(B=256, kind="jfa", **g)),
                 ("jfa B128 non-causal", dict(B=128, kind="jfa", causal=False, **g)),
                 ("block64 B256", dict(B=256, kind="block", **g)),
                 ("cross q B256", dict(B=256, cross="q", **g)),
                 ("cross kv B256", dict(B=256, cross="kv", **g)),
                 ("cross q B128", dict(B=128, cross="q", **g))]
    out = []
    for name, kw in cases:
        try:
            out.append(_case(name, dev, **kw))
        except Exception as e:  # noqa: BLE001 - record and go on (e.g. out of memory)
            print(f"{name}: {type(e).__name__}: {e}", flush=True)
            out.append({"case": name, "error": f"{type(e).__name__}: {e}"[:400]})
        if dev.type == "cuda":
            torch.cuda.empty_cache()
    return out


# ---- host time per eager op ----------------------------------------------------------------------
def launch(dev, smoke: bool) -> dict:
    n = 200 if smoke else 2000
    x = torch.zeros(1, device=dev)
    w = torch.ones(1, device=dev, requires_grad=True)

    def plain():
        for _ in range(n):
            x.add_(1)

    def autograd():
        for _ in range(n // 2):
            (x * w).backward()

    res = {}
    for label, fn in (("eager_op_s", plain), ("autograd_mul_fwd_bwd_s", autograd)):
        best = math.inf
        for _ in range(5):
            _sync(dev)
            t = time.perf_counter()
            fn()
            host = time.perf_counter() - t
            _sync(dev)
            best = min(best, host)
        res[label] = best / (n if label == "eager_op_s" else n // 2)
    res["note"] = ("host seconds per call, the fastest of 5 loops (eager_op: x.add_(1); autograd_mul_fwd_bwd: "
                   "(x * w).backward(), one mul forward and its backward)")
    print(f"launch: eager op {res['eager_op_s'] * 1e6:.2f} us, autograd mul fwd+bwd "
          f"{res['autograd_mul_fwd_bwd_s'] * 1e6:.2f} us", flush=True)
    return res


# ---- torch embeddings and their sparse update ---------------------------------------------------
def sparse_update(dev, smoke: bool) -> dict:
    from executor.optim import RowWiseAdagrad

    B = 8 if smoke else 256
    rows = 1000 if smoke else 1_000_000
    pooled = [(128, 8)] * (2 if smoke else 24) + [(128, 3)] * (2 if smoke else 24)
    seq_ids = 100 if smoke else 195_359
    seq_tables = [(rows * 2 if not smoke else 2000, 128), (64, 32)]
    gen = torch.Generator(device="cpu").manual_seed(0)
    tabs = [torch.nn.Parameter(torch.randn(rows, d, device=dev) * 0.01) for d, _ in pooled]
    stabs = [torch.nn.Parameter(torch.randn(r, d, device=dev) * 0.01) for r, d in seq_tables]
    bags = [(torch.randint(0, rows, (B * p,), generator=gen).to(dev),
             torch.arange(0, B * p + 1, p, device=dev)) for _, p in pooled]
    sids = [torch.randint(0, r, (seq_ids,), generator=gen).to(dev) for r, _ in seq_tables]
    opt = RowWiseAdagrad(tabs + stabs, lr=0.05)

    def forward():
        outs = [F.embedding_bag(ids, w, off, mode="sum", include_last_offset=True, sparse=True)
                for w, (ids, off) in zip(tabs, bags)]
        seq = torch.cat([F.embedding(ids, w, sparse=True) for w, ids in zip(stabs, sids)], dim=1)
        return torch.cat(outs, dim=1).sum() + seq.sum()

    res: dict = {"batch": B, "pooled_tables": len(pooled), "pooled_ids": sum(B * p for _, p in pooled),
                 "sequence_tables": len(seq_tables), "sequence_ids": seq_ids, "rows": rows, "dim": 128}
    times = {"fwd": [], "bwd": [], "step": [], "fwd_host": [], "bwd_host": [], "step_host": []}
    for i in range(4):
        opt.zero_grad(set_to_none=True)
        holder = {}
        for part, fn in (("fwd", lambda: holder.update(loss=forward())), ("bwd", lambda: holder["loss"].backward()),
                         ("step", opt.step)):
            _sync(dev)
            t = time.perf_counter()
            dt = _timed(dev, fn)
            host = time.perf_counter() - t
            if i:
                times[part].append(dt)
                times[f"{part}_host"].append(host)
    res |= {f"{k}_s": statistics.median(v) for k, v in times.items()}
    opt.zero_grad(set_to_none=True)
    holder = {}
    for part, fn in (("fwd", lambda: holder.update(loss=forward())), ("bwd", lambda: holder["loss"].backward()),
                     ("step", opt.step)):
        ks = _kernels(dev, fn)
        res |= {f"{part}_kernel_calls": sum(k[1] for k in ks), f"{part}_kernel_s": sum(k[2] for k in ks),
                f"{part}_kernels": ks[:12]}
    print(f"sparse: fwd {res['fwd_s'] * 1e3:.3f} ms, bwd {res['bwd_s'] * 1e3:.3f} ms, "
          f"RowWiseAdagrad step {res['step_s'] * 1e3:.3f} ms ({res['step_kernel_calls']} kernels)", flush=True)
    return res


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--only", default=",".join(PARTS))
    ap.add_argument("--smoke", action="store_true", help="CPU, toy sizes: checks the code, not the speed")
    a = ap.parse_args(argv)
    dev = torch.device("cpu" if a.smoke or not torch.cuda.is_available() else "cuda")
    parts = [p for p in a.only.split(",") if p]
    result: dict = {"device": torch.cuda.get_device_name() if dev.type == "cuda" else f"cpu {platform.processor()}",
                    "torch": torch.__version__, "utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    for p in parts:
        t = time.perf_counter()
        result["cases" if p == "reference_attention" else p] = globals()[p](dev, a.smoke)
        print(f"[{p}: {time.perf_counter() - t:.1f} s]", flush=True)
        Path(a.out).write_text(json.dumps(result, indent=1) + "\n")
    return result


if __name__ == "__main__":
    main()
