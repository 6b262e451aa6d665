"""Embedding lookup bandwidth on one GPU: the Triton TBE (kernels/embedding) against PyTorch.

Shapes come from a scenario (default gem-h200-1gpu): its pooled tables (sum-pooled bags, one
launch per dim) and its sequence groups (unpooled jagged lookups), ids Zipf-skewed as
executor/data.py draws them, at the scenario's micro-batch and larger ones. For each case:

1. correctness first: our output (poisoned before the run) against a float64 reference, and
   our sparse gradients against PyTorch's (``F.embedding_bag``/``F.embedding`` with
   ``sparse=True``, coalesced; every parameter's ``.grad`` cleared first, since backward
   accumulates). A failed check prints, per table, which rows differ (touched by one side only,
   non-finite, largest errors), also saved as the case's ``diffs``;
2. forward time (``triton.testing.do_bench`` median, rotating over several id batches) of ours
   (a few block/warp configurations), ``F.embedding_bag``/``F.embedding`` per table (what the
   model ran before) and ``index_select`` + segment sum (``index_add_``);
3. forward+backward time to gradients the optimizer can use (coalesced sparse).

Effective bandwidth = (rows gathered × row bytes + output bytes + ids/offsets bytes) / time
(``kernels.embedding.cost``; hot rows served by the L2 count too). Also measures the device
copy bandwidth (read + write) as the ceiling. Writes ``$OUT/embedding_bench.json`` and prints a
table. ``--cpu-smoke`` runs the same code at toy sizes on the CPU under TRITON_INTERPRET=1.

    python3 executor/bench/embedding_bench.py [--scenario gem-h200-1gpu] [--batches 256,2048]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def parse(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--scenario", default="gem-h200-1gpu")
    p.add_argument("--batches", default="", help="comma-separated micro-batch sizes (default: the scenario's, x8)")
    p.add_argument("--rotate", type=int, default=3, help="id batches to rotate over while timing")
    p.add_argument("--out", default=os.environ.get("OUT", "."), help="folder for embedding_bench.json")
    p.add_argument("--cpu-smoke", action="store_true", help="toy sizes on the CPU under TRITON_INTERPRET=1")
    p.add_argument("--no-sweep", action="store_true", help="time only the default kernel configuration")
    return p.parse_args(argv)


def main(argv=None) -> dict:
    args = parse(argv)
    if args.cpu_smoke:
        os.environ["TRITON_INTERPRET"] = "1"
    import torch

    import scenarios
    from executor.data import SyntheticData, pooled_table_groups, sequence_table_groups
    from kernels.embedding import cost, tbe
    from kernels.embedding.layout import FusedTables
    from kernels.embedding.reference import pooled_index_select

    F = torch.nn.functional
    dev = torch.device("cpu" if args.cpu_smoke else "cuda")
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("error: no CUDA device; run with --cpu-smoke on a CPU")
    if args.cpu_smoke:
        s = scenarios.load("debug-cpu")
        batches = [int(b) for b in args.batches.split(",")] if args.batches else [4]
        sweep = {"pooled": [(8, None)], "unpooled": [(32, None)]}
    else:
        s = scenarios.load(args.scenario)
        mb = s.training.micro_batch
        batches = [int(b) for b in args.batches.split(",")] if args.batches else [mb, 8 * mb]
        more = not args.no_sweep
        sweep = {"pooled": [(None, None)] + ([(8, 1), (8, 4), (16, 2), (16, 8), (32, 4)] if more else []),
                 "unpooled": [(32, None)] + ([(16, 2), (32, 4), (64, 4), (64, 8), (128, 8)] if more else [])}
    emb = s.model.embeddings
    torch.manual_seed(0)
    rows_out: list[dict] = []
    result = {"scenario": s.name, "device": _device_info(torch, dev), "cases": rows_out}
    if dev.type == "cuda":
        result["copy_tb_s"] = _copy_bandwidth(torch)
        print(f"device copy (read + write): {result['copy_tb_s']:.2f} TB/s", flush=True)

    # the tables: one fused buffer per dim group, per-table parameter views (as the model has them)
    pooled = []
    for g in pooled_table_groups(emb):
        f = FusedTables(g.rows, g.dim, device=dev)
        f.buffer.normal_()
        pooled.append((g, f, [torch.nn.Parameter(v) for v in f.views()]))
    seq = []
    for sg in emb.sequences:
        groups = []
        for g in sequence_table_groups(sg):
            f = FusedTables(g.rows, g.dim, device=dev)
            f.buffer.normal_()
            groups.append((g, f, [torch.nn.Parameter(v) for v in f.views()],
                           torch.tensor(g.cols, dtype=torch.int64, device=dev)))
        seq.append((sg, groups, sum(fam.count * fam.dim for fam in sg.tables)))

    data = SyntheticData(s, 0)
    for B in batches:
        draws = []
        for _ in range(max(args.rotate, 1)):
            b = data.batch(B)
            b.validate(s.model)
            draws.append(b.pack(s.model).to(dev))
        # ---- pooled: all pooled tables of a dim in one launch --------------------------------
        for g, f, params in pooled:
            rs = f.row_starts_on(dev)
            packs = [d.pooled_packed(g) for d in draws]
            bags = [[d.pooled[n] for n in g.names] for d in draws]
            n_ids = statistics.fmean(int(p[0].numel()) for p in packs)
            c = cost.pooled_cost(n_ids, B * len(g.names), g.dim, elem_bytes=f.buffer.element_size())
            name = f"pooled dim {g.dim} x{len(g.names)} tables B={B}"
            # correctness (float64 reference, poisoned output) and gradients against PyTorch's
            out = torch.full((B, len(g.names) * g.dim), float("nan"), device=dev)
            tbe.pooled_forward(f.buffer, rs, *packs[0], B, out=out)
            ref = torch.cat([_bag_sum64(torch, w, v, o) for w, (v, o) in zip(params, bags[0])], dim=1)
            err = _rel(out, ref)
            grad_err, grad_notes = _pooled_grad_err(torch, tbe, f, params, packs[0], bags[0], B, g.names, 1e-5)
            ok = bool(torch.isfinite(out).all()) and err < 1e-5 and grad_err < 1e-5
            notes = _dense_diff(torch, out, ref, g.names, [g.dim] * len(g.names), 1e-5, "bag") + grad_notes
            row = dict(case=name, kind="pooled", batch=B, tables=len(g.names), dim=g.dim, ids=n_ids,
                       bytes=c.bytes, rel_err=err, grad_rel_err=grad_err, correct=ok, diffs=notes, fwd={}, fwd_bwd={})
            print(f"{name}: rel err {err:.2e}, grad rel err {grad_err:.2e} {'ok' if ok else 'WRONG'}", flush=True)
            _print_diffs(ok, notes)
            for bn, nw in sweep["pooled"]:
                key = f"triton bn={bn or 'auto'} w={nw or 'auto'}"
                row["fwd"][key] = _time(torch, dev, lambda i: tbe.pooled_forward(
                    f.buffer, rs, *packs[i], B, block_n=bn, num_warps=nw), len(draws))
            row["fwd"]["torch embedding_bag"] = _time(torch, dev, lambda i: [F.embedding_bag(
                v, w, o, mode="sum", include_last_offset=True) for w, (v, o) in zip(params, bags[i])], len(draws))
            row["fwd"]["torch index_select+index_add"] = _time(
                torch, dev, lambda i: pooled_index_select([w.detach() for w in params], bags[i]), len(draws))
            gout = torch.randn(B, len(g.names) * g.dim, device=dev)
            row["fwd_bwd"]["triton"] = _time(torch, dev, lambda i: _ours_pooled_step(
                tbe, f, params, packs[i], B, gout), len(draws), grads=params)
            row["fwd_bwd"]["torch embedding_bag"] = _time(torch, dev, lambda i: _torch_pooled_step(
                torch, params, bags[i], gout), len(draws), grads=params)
            _finish(row, c.bytes)
            rows_out.append(row)
        # ---- sequence groups: unpooled jagged lookups into the concatenated [ΣL, D_g] ---------
        for sg, groups, width in seq:
            N = int(draws[0].sequences[sg.name].offsets[-1])
            Ns = [int(d.sequences[sg.name].offsets[-1]) for d in draws]
            specs = [[(f, cols, params, d.sequence_packed(sg.name, g)) for g, f, params, cols in groups]
                     for d in draws]
            tables = {n: w for g, _, params, _ in groups for n, w in zip(g.names, params)}
            order = [n for fam in sg.tables for n in fam.table_names()]
            elem = groups[0][1].buffer.element_size()
            c_bytes = sum(cost.unpooled_cost(statistics.fmean(Ns), g.dim, elem_bytes=elem).bytes * len(g.names)
                          for g, _, _, _ in groups)
            name = f"sequence '{sg.name}' {len(order)} tables width {width} B={B}"
            ids0 = draws[0].sequences[sg.name].ids
            out = tbe.unpooled_lookup(specs[0], N, width).detach()
            ref = torch.cat([tables[n].detach().index_select(0, ids0[n]).double() for n in order], dim=1)
            err = _rel(out, ref)
            grad_err, grad_notes = _unpooled_grad_err(torch, tbe, specs[0], N, width, tables, order, ids0, 1e-5)
            poisoned = torch.full((N, width), float("nan"), device=dev)
            for g, f, params, cols in groups:
                tbe.unpooled_forward(f.buffer, f.row_starts_on(dev), cols, draws[0].sequence_packed(sg.name, g),
                                     poisoned)
            ok = bool(torch.isfinite(poisoned).all()) and err < 1e-6 and grad_err < 1e-5
            dims = [tables[n].shape[1] for n in order]
            notes = (_dense_diff(torch, out, ref, order, dims, 1e-6, "token")
                     + _dense_diff(torch, poisoned, ref, order, dims, 1e-6, "token", what="poisoned output")
                     + grad_notes)
            row = dict(case=name, kind="unpooled", batch=B, tables=len(order), dim=width, ids=statistics.fmean(Ns),
                       bytes=c_bytes, rel_err=err, grad_rel_err=grad_err, correct=ok, diffs=notes, fwd={}, fwd_bwd={})
            print(f"{name}: rel err {err:.2e}, grad rel err {grad_err:.2e} {'ok' if ok else 'WRONG'}", flush=True)
            _print_diffs(ok, notes)
            outs = [torch.empty(n, width, device=dev) for n in Ns]
            for bn, nw in sweep["unpooled"]:
                row["fwd"][f"triton bn={bn} w={nw or 'auto'}"] = _time(torch, dev, lambda i: [tbe.unpooled_forward(
                    f.buffer, f.row_starts_on(dev), cols, draws[i].sequence_packed(sg.name, g), outs[i],
                    block_n=bn, num_warps=nw) for g, f, params, cols in groups], len(draws))
            row["fwd"]["torch embedding+cat"] = _time(torch, dev, lambda i: torch.cat(
                [F.embedding(draws[i].sequences[sg.name].ids[n], tables[n]) for n in order], dim=1), len(draws))
            row["fwd"]["torch index_select+cat"] = _time(torch, dev, lambda i: torch.cat(
                [tables[n].detach().index_select(0, draws[i].sequences[sg.name].ids[n]) for n in order], dim=1),
                len(draws))
            gouts = [torch.randn(n, width, device=dev) for n in Ns]
            params_all = list(tables.values())
            row["fwd_bwd"]["triton"] = _time(torch, dev, lambda i: _ours_unpooled_step(
                tbe, specs[i], Ns[i], width, gouts[i], params_all), len(draws), grads=params_all)
            row["fwd_bwd"]["torch embedding+cat"] = _time(torch, dev, lambda i: _torch_unpooled_step(
                torch, tables, order, draws[i].sequences[sg.name].ids, gouts[i]), len(draws), grads=params_all)
            _finish(row, c_bytes)
            rows_out.append(row)
        del draws

    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "embedding_bench.json").write_text(json.dumps(result, indent=1) + "\n")
    _print_table(result)
    if not all(r["correct"] for r in rows_out):
        print("error: a correctness check failed (see 'WRONG' above)")
        raise SystemExit(1)
    return result


# ---- steps ---------------------------------------------------------------------------------------
def _ours_pooled_step(tbe, f, params, pack, B, gout):
    tbe.pooled_lookup(f, params, *pack, B).backward(gout)
    for p in params:
        p.grad = p.grad.coalesce()  # a no-op here: already coalesced


def _torch_pooled_step(torch, params, bags, gout):
    outs = [torch.nn.functional.embedding_bag(v, w, o, mode="sum", include_last_offset=True, sparse=True)
            for w, (v, o) in zip(params, bags)]
    torch.cat(outs, dim=1).backward(gout)
    for p in params:
        p.grad = p.grad.coalesce()  # what the optimizer does first


def _ours_unpooled_step(tbe, spec, N, width, gout, params):
    tbe.unpooled_lookup(spec, N, width).backward(gout)
    for p in params:
        p.grad = p.grad.coalesce()


def _torch_unpooled_step(torch, tables, order, ids, gout):
    out = torch.cat([torch.nn.functional.embedding(ids[n], tables[n], sparse=True) for n in order], dim=1)
    out.backward(gout)
    for n in order:
        tables[n].grad = tables[n].grad.coalesce()


def _pooled_grad_err(torch, tbe, f, params, pack, bags, B, names, tol) -> tuple[float, list[str]]:
    """Worst relative error of our sparse gradients against PyTorch's, and notes on what differs."""
    gout = torch.randn(B, len(params) * f.dim, device=f.buffer.device)
    for p in params:
        p.grad = None  # backward accumulates: a gradient left by an earlier step would be added to ours
    _ours_pooled_step(tbe, f, params, pack, B, gout)
    ours = [p.grad for p in params]
    for p in params:
        p.grad = None
    _torch_pooled_step(torch, params, bags, gout)
    theirs = [p.grad for p in params]
    for p in params:
        p.grad = None
    return _sparse_err(torch, ours, theirs, names, tol)


def _unpooled_grad_err(torch, tbe, spec, N, width, tables, order, ids, tol) -> tuple[float, list[str]]:
    gout = torch.randn(N, width, device=spec[0][0].buffer.device)
    params = list(tables.values())
    for p in params:
        p.grad = None  # as in _pooled_grad_err
    _ours_unpooled_step(tbe, spec, N, width, gout, params)
    ours = {n: tables[n].grad for n in order}
    for p in params:
        p.grad = None
    _torch_unpooled_step(torch, tables, order, ids, gout)
    theirs = {n: tables[n].grad for n in order}
    for p in params:
        p.grad = None
    return _sparse_err(torch, [ours[n] for n in order], [theirs[n] for n in order], order, tol)


def _ids(t, k: int = 8) -> str:
    v = t.tolist()
    return f"{v[:k]}{' ...' if len(v) > k else ''}"


def _sparse_err(torch, ours, theirs, names, tol) -> tuple[float, list[str]]:
    """Worst relative error over the tables (inf where the touched rows differ) and, per table that
    differs, which rows: touched by one side only, non-finite, or with the largest errors."""
    worst, notes = 0.0, []
    for name, a, b in zip(names, ours, theirs):
        a, b = a.coalesce(), b.coalesce()
        ia, ib = a.indices()[0], b.indices()[0]
        if not torch.equal(ia, ib):
            worst = float("inf")
            only_a = ia[~torch.isin(ia, ib)]
            only_b = ib[~torch.isin(ib, ia)]
            notes.append(f"grad table {name}: {ia.numel()} rows in ours, {ib.numel()} in PyTorch's; "
                         f"{only_a.numel()} only in ours {_ids(only_a.cpu())}, "
                         f"{only_b.numel()} only in PyTorch's {_ids(only_b.cpu())}")
            continue
        va, vb = a.values().double(), b.values().double()
        err = _rel(va, vb)
        worst = max(worst, err)
        bad = ~torch.isfinite(va).all(dim=1)
        if err >= tol or bad.any():
            row_err = (va - vb).norm(dim=1) / vb.norm().clamp(min=1e-30)
            top = row_err.nan_to_num(float("inf")).topk(min(5, row_err.numel())).indices
            notes.append(f"grad table {name}: rel err {err:.2e}; {int(bad.sum())} rows non-finite "
                         f"{_ids(ia[bad].cpu())}; largest errors at rows {_ids(ia[top].cpu())} "
                         f"({', '.join(f'{float(e):.1e}' for e in row_err[top])})")
    return worst, notes


def _dense_diff(torch, out, ref, names, dims, tol, unit, what="output") -> list[str]:
    """Per table (its column block of ``out``): relative error and the rows (bags or tokens) that
    are non-finite or differ most, for the tables over ``tol``."""
    notes, col = [], 0
    for name, d in zip(names, dims):
        a, b = out[:, col:col + d].detach().double(), ref[:, col:col + d].detach().double()
        col += d
        bad = ~torch.isfinite(a).all(dim=1)
        err = _rel(a, b)
        if err < tol and not bad.any():
            continue
        row_err = (a - b).norm(dim=1).nan_to_num(float("inf"))
        top = row_err.topk(min(5, row_err.numel())).indices
        notes.append(f"{what} table {name}: rel err {err:.2e}; {int(bad.sum())} {unit}s non-finite "
                     f"{_ids(bad.nonzero()[:, 0].cpu())}; largest errors at {unit}s {_ids(top.cpu())}")
    return notes


def _print_diffs(ok: bool, notes: list[str]) -> None:
    if not ok:
        for n in notes or ["(no table over its tolerance: see the errors above)"]:
            print("  differs: " + n, flush=True)


def _bag_sum64(torch, w, values, offsets):
    """Float64 sums of the bags (rows gathered first: no float64 copy of a whole table)."""
    B = len(offsets) - 1
    bag = torch.repeat_interleave(torch.arange(B, device=w.device), offsets.diff(), output_size=len(values))
    rows = w.detach().index_select(0, values).double()
    return torch.zeros(B, w.shape[1], dtype=torch.float64, device=w.device).index_add_(0, bag, rows)


def _rel(a, b) -> float:
    a, b = a.detach().double(), b.detach().double()
    return float((a - b).norm() / b.norm().clamp(min=1e-30))


# ---- timing --------------------------------------------------------------------------------------
def _time(torch, dev, fn, n: int, grads=None) -> float:
    """Median seconds of ``fn(i)``, ``i`` rotating over ``n`` input sets."""
    state = {"i": 0}

    def call():
        if grads is not None:
            for p in grads:
                p.grad = None
            fn(state["i"] % n)
        else:
            with torch.no_grad():  # forward only: no autograd graph for either side
                fn(state["i"] % n)
        state["i"] += 1

    if dev.type == "cuda":
        import triton

        t = triton.testing.do_bench(call, warmup=25, rep=200, return_mode="median") * 1e-3
    else:
        times = []
        for _ in range(1):  # the CPU smoke checks the logic, not the speed
            start = time.perf_counter()
            call()
            times.append(time.perf_counter() - start)
        t = statistics.median(times)
    for p in grads or ():
        p.grad = None  # leave no gradient behind for the next case's checks
    return t


def _finish(row: dict, nbytes: float) -> None:
    row["fwd_tb_s"] = {k: nbytes / t / 1e12 for k, t in row["fwd"].items()}
    best = min((k for k in row["fwd"] if k.startswith("triton")), key=row["fwd"].get)
    row["best_triton"] = best
    for k in ("fwd", "fwd_bwd"):
        print("  " + k + ": " + ", ".join(f"{name} {t * 1e6:.1f} us" for name, t in row[k].items()), flush=True)


def _copy_bandwidth(torch) -> float:
    import triton

    x = torch.empty(2 * 2**30 // 4, dtype=torch.float32, device="cuda").normal_()
    y = torch.empty_like(x)
    t = triton.testing.do_bench(lambda: y.copy_(x), warmup=25, rep=200, return_mode="median") * 1e-3
    return 2 * x.numel() * 4 / t / 1e12


def _device_info(torch, dev) -> dict:
    info = {"device": dev.type, "torch": torch.__version__}
    try:
        import triton

        info["triton"] = triton.__version__
    except ImportError:
        pass
    if dev.type == "cuda":
        info["name"] = torch.cuda.get_device_name(dev)
    return info


def _print_table(result: dict) -> None:
    print()
    print(f"{'case':<52} {'ours best':>22} {'TB/s':>6} {'emb_bag/emb':>11} {'TB/s':>6} {'idx_sel':>8} "
          f"{'fwd+bwd ours':>12} {'torch':>8}")
    for r in result["cases"]:
        best = r["best_triton"]
        torch_key = next(k for k in r["fwd"] if k.startswith("torch embedding"))
        idx_key = next(k for k in r["fwd"] if "index_select" in k)
        fb = r["fwd_bwd"]
        torch_fb = next(k for k in fb if k.startswith("torch"))
        print(f"{r['case']:<52} {best[7:] + ' ' + format(r['fwd'][best] * 1e6, '.1f') + 'us':>22} "
              f"{r['fwd_tb_s'][best]:>6.2f} {r['fwd'][torch_key] * 1e6:>9.1f}us {r['fwd_tb_s'][torch_key]:>6.2f} "
              f"{r['fwd_tb_s'][idx_key]:>8.2f} {fb['triton'] * 1e6:>10.1f}us {fb[torch_fb] * 1e6:>6.1f}us")


if __name__ == "__main__":
    main()
