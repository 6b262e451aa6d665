"""Compile the core's kernels for an H100/H200 (sm_90) without a GPU.

    python -m kernels.flash.compile_check            # from the repo root; TRITON_INTERPRET unset
    python -m kernels.flash.compile_check --only flash   # the FA2-style kernels' new rows and MXFP8 P

``triton.compile`` with an ``ASTSource`` and ``GPUTarget("cuda", 90, 128)`` runs the whole
pipeline (TTIR -> TTGIR -> LLVM -> PTX -> cubin with Triton's bundled ptxas), so a kernel that
does not compile for the GPU fails here, on a CPU-only machine; then ``ptxas -v`` on the PTX
gives registers, spills and shared memory per variant. Signatures mimic the launcher's
specialisation at the benchmark shape (bf16, H=4, D=128: pointers and strides divisible by 16).
The variants are the table's tiles and the ones ``gpu_check --only block`` sweeps.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from kernels.flash import _block as KB
from kernels.flash import gpu_check as gc
from kernels.flash import tiles as TT
from kernels.flash.core import INTERPRETED
from kernels.flash.options import BlockTiles, Tiles

TARGET = GPUTarget("cuda", 90, 128)
PTR = {"bf16": "*bf16", "fp16": "*fp16", "fp32": "*fp32"}


def _source(fn, dtype: str, consts: dict, desc_rows: dict | None = None) -> ASTSource:
    """Signature of ``fn``: tensors in ``dtype`` (LSE, DELTA fp32, PLAN int32), ints i32, scales fp32,
    constexprs from ``consts``; pointers and strides get the divisibility-16 hint the launcher
    gives them at the benchmark shape (T_q is not specialised). ``desc_rows``: the TMA kernels'
    descriptors (``desc_q`` ...) and the rows of the ``[rows, D]`` tiles they load."""
    sig, attrs = {}, {}
    for i, name in enumerate(fn.arg_names):
        if name in consts:
            sig[name] = "constexpr"
        elif name.startswith("desc_"):
            sig[name] = f"tensordesc<{dtype}[{desc_rows[name]}, {consts['D']}]>"
        elif name in ("LSE", "DELTA"):
            sig[name] = "*fp32"
        elif name == "PLAN":
            sig[name] = "*i32"
        elif name.isupper():
            sig[name] = PTR[dtype]
        elif name in ("scale", "qk_scale"):
            sig[name] = "fp32"
        else:
            sig[name] = "i32"
        if name not in consts and not name.startswith("desc_") and (name.isupper() or name.startswith("stride_")):
            attrs[(i,)] = [["tt.divisibility", 16]]
    return ASTSource(fn, sig, constexprs=consts, attrs=attrs)


def _ptxas_v(ptx: str) -> str:
    ptxas = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")
    path = "/tmp/compile_check.ptx"
    with open(path, "w") as f:
        f.write(ptx)
    r = subprocess.run([ptxas, "-v", "--gpu-name", "sm_90a", path, "-o", "/tmp/compile_check.cubin"],
                       capture_output=True, text=True)
    info = r.stderr
    regs = re.search(r"Used (\d+) registers", info)
    spill = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", info)
    return (f"regs {regs.group(1) if regs else '?'}, spills {spill.group(1) if spill else '?'}/"
            f"{spill.group(2) if spill else '?'} B")


def variants():
    """(label, kernel, dtype, constexprs, warps, stages) of every variant to compile."""
    out = []
    tiles = {"table64": TT.BLOCK_LOCAL_GPU, "table128": TT.BLOCK_LOCAL_GPU_128}
    for weight, wid in (("softmax", 0), ("silu", 1)):
        for causal in (False, True):
            for label, (fwd, bwd) in tiles.items():
                W = 128 if label == "table128" else 64
                for kname, fn, t in (("fwd", KB._block_fwd_kernel, fwd),
                                     ("bwd", KB._block_bwd_kernel, bwd)):
                    out.append((f"{kname} {weight} causal={causal} W={W} {label} {t}", fn, "bf16",
                                _consts(wid, causal, W, t, 128), t.warps, t.stages))
    for kname, fn, names in (("fwd", KB._block_fwd_kernel, gc.BLOCK_LOCAL_FWD_SWEEP),
                             ("bwd", KB._block_bwd_kernel, gc.BLOCK_LOCAL_BWD_SWEEP)):
        for label in names:  # what gpu_check --only block sweeps
            t = gc.BLOCK_TILES[label]
            out.append((f"{kname} softmax W=64 sweep {label}", fn, "bf16",
                        _consts(0, False, 64, t, 128), t.warps, t.stages))
    t = BlockTiles(64, 2, 4, 2)
    out.append(("bwd gelu causal W=64 D=64", KB._block_bwd_kernel, "bf16",
                _consts(2, True, 64, t, 64), 4, 2))
    out.append(("bwd softmax W=16 fp16", KB._block_bwd_kernel, "fp16",
                _consts(0, False, 16, t, 128), 4, 2))
    t = TT.BLOCK_LOCAL_FP32[1]
    out.append(("bwd softmax W=64 fp32", KB._block_bwd_kernel, "fp32",
                _consts(0, False, 64, t, 128, prec="ieee", asm=False), t.warps, t.stages))
    return out


def flash_variants():
    """The FA2-style kernels (``_kernels.py``) at the table's 64x32 rows (causal GDPA <= 1024,
    a short cross side) and with MXFP8 P (``QUANT_P``, ``tiles.MX``); their TMA forms (``_tma.py``)
    at the table's tiles."""
    from kernels.flash import _kernels as K

    out = []
    base = dict(BLOCK_W=0, ALIGNED=True, USE_ASM=True, DOT_PREC="default", D=128)
    for label, cfg, weight, causal in (("causal silu", TT.SHORT_CAUSAL_ACT, 1, True),
                                       ("short side softmax", TT.SHORT_SIDE_CONFIG, 0, False),
                                       ("MXFP8 P causal silu", TT.MX, 1, True)):
        quant = cfg is TT.MX
        t = cfg.fwd
        out.append((f"flash fwd {label} {t}", K._fwd_kernel, "bf16",
                    dict(base, WEIGHT=weight, CAUSAL=causal, BM=t.own, BN=t.other, QUANT_P=quant), t.warps, t.stages))
        t = cfg.dkdv
        out.append((f"flash dkdv {label} {t}", K._dkdv_kernel, "bf16",
                    dict(base, WEIGHT=weight, CAUSAL=causal, ATOMIC_DQ=False, BN=t.own, BM=t.other, QUANT_P=quant),
                    t.warps, t.stages))
        t = cfg.dq
        out.append((f"flash dq {label} {t}", K._dq_kernel, "bf16",
                    dict(base, WEIGHT=weight, CAUSAL=causal, BM=t.own, BN=t.other), t.warps, t.stages))
    for long_q in (True, False):  # the one-kernel short-side backward (Config.fused_short), N = 32
        for t in (Tiles(64, 32, 4, 3), Tiles(64, 32, 8, 2), Tiles(32, 32, 4, 2), Tiles(32, 32, 4, 3),
                  Tiles(128, 32, 8, 2)):
            out.append((f"flash short_bwd softmax long_q={long_q} S=32 {t}", K._short_bwd_kernel, "bf16",
                        dict(WEIGHT=0, USE_ASM=True, DOT_PREC="default", LONG_Q=long_q, BL=t.own, S=32, D=128),
                        t.warps, t.stages))
    from kernels.flash import _tma as KT

    for label, cfg, weight, causal in (("GDPA silu", TT.SHORT_NONCAUSAL_CONFIG, 1, False),
                                       ("causal silu", TT.SHORT_CAUSAL_ACT, 1, True),
                                       ("JFA causal softmax", TT.SHORT_CAUSAL_CONFIG, 0, True),
                                       ("long causal softmax", TT.LONG_TMA, 0, True)):  # what use_tma launches
        t = cfg.fwd
        out.append((f"flash TMA fwd {label} {t}", KT._fwd_kernel, "bf16",
                    dict(base, ALIGNED=False, WEIGHT=weight, CAUSAL=causal, BM=t.own, BN=t.other), t.warps, t.stages,
                    dict(desc_q=t.own, desc_k=t.other, desc_v=t.other)))
        t = cfg.dkdv
        out.append((f"flash TMA dkdv {label} {t}", KT._dkdv_kernel, "bf16",
                    dict(base, ALIGNED=False, WEIGHT=weight, CAUSAL=causal, BN=t.own, BM=t.other), t.warps, t.stages,
                    dict(desc_q=t.other, desc_k=t.own, desc_v=t.own, desc_do=t.other)))
    for t in (TT.SHORT_CAUSAL_ACT.dkdv, Tiles(64, 32, 8, 3)):  # step_bench's "+atomic" variants
        out.append((f"flash dkdv+atomic dQ causal silu {t}", K._dkdv_kernel, "bf16",
                    dict(base, WEIGHT=1, CAUSAL=True, ATOMIC_DQ=True, BN=t.own, BM=t.other, QUANT_P=False),
                    t.warps, t.stages))
    return out


def pipelined(ttgir: str) -> str:
    """How the loads were pipelined: async copies in the kernel and the depths of their waits
    (a wait of 0 right after every copy in a loop means no load is in flight across steps)."""
    waits = re.findall(r"async_wait .*?\{num = (\d+)", ttgir)
    return (f"{ttgir.count('async_copy_global_to_local')} async copies "
            f"({ttgir.count('async_tma_copy_global_to_local')} TMA), waits {'/'.join(waits) or '-'}")


def _consts(weight, causal, W, t, D, prec="default", asm=True):
    return dict(WEIGHT=weight, CAUSAL=causal, BLOCK_W=W, USE_ASM=asm, DOT_PREC=prec,
                BM=TT.block_tile_rows(t, W), G=t.groups, D=D)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--only", default="", choices=["", "flash"], help="flash: the FA2-style kernels only")
    opts = p.parse_args(argv)
    if INTERPRETED:
        sys.exit("compile_check: unset TRITON_INTERPRET (the interpreter replaces the compiler)")
    fails = 0
    for label, fn, dtype, consts, warps, stages, *desc in (flash_variants() if opts.only else variants() + flash_variants()):
        try:
            k = triton.compile(_source(fn, dtype, consts, *desc), target=TARGET,
                               options=dict(num_warps=warps, num_stages=stages))
            print(f"OK   {label}: smem {k.metadata.shared} B, {_ptxas_v(k.asm['ptx'])}, {pipelined(k.asm['ttgir'])}",
                  flush=True)
        except Exception as e:  # noqa: BLE001
            fails += 1
            print(f"FAIL {label}: {type(e).__name__}: {str(e)[-800:]}", flush=True)
    print(f"{fails} failed")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
