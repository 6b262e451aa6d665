"""The quantizer's cost where no GPU is lent: ``_dual4_kernel`` compiled for sm_90a on this machine
(Triton's own ptxas and nvdisasm), registers, spills and SASS instructions per element, per epilogue
and launch config. No loop in the kernel, so the static count is what each thread issues.

    python -m kernels.fp8block.sass [--configs four_w8,four_w8_pack]

At the H200's issue rate (132 SMs × 4 schedulers × ~1.98 GHz, one warp instruction each per clock:
33e12 thread instructions/s) a kernel over T·H elements needs ``T·H·instr / 33e12`` s of issue;
the MLP block's GELU quantizers (147,456 × 4,096) move 2.4 GB (forward) and 3.6 GB (backward),
0.59 and 0.88 ms at 4.1 TB/s. Above ~32 (forward) and ~48 (backward) instructions per element the
kernel is issue-bound before it is memory-bound.
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import subprocess
import tempfile

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from kernels.fp8block.quantize import CONFIGS, EPILOGUES, _dual4_kernel
from kernels.mxfp8.quantize import elem_constexprs

BIN = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
TYPES = dict(x_ptr="*bf16", h_ptr="*bf16", b_ptr="*fp32", g_ptr="*fp32", mu_ptr="*fp32", rs_ptr="*fp32", q_ptr="*u8",
             s_ptr="*fp32", qt_ptr="*i32", st_ptr="*fp32",
             db_ptr="*fp32", R="i32", C="i32", R128="i32", s_xr="i32", s_hr="i32")
ALIGNED = [n for n in TYPES if n != "R"]  # what the launcher specializes as multiples of 16 at the block's shapes


def compile_dual4(epilogue: str, config: str):
    """``_dual4_kernel`` for sm_90a; ``layer_norm`` reads an fp32 ``x`` (the executor's residual stream)."""
    cfg = CONFIGS[config]
    pack = cfg.get("pack", False)
    ce = dict(EPILOGUE=EPILOGUES[epilogue], ROW=True, COL=True, DBIAS=epilogue == "bias_gelu_grad", FAST_ERF=2,
              CAST=1 if cfg.get("cast", "asm") == "asm" else 0, PACK=pack, EVEN=True, **elem_constexprs("e4m3"),
              SOFT_CAST=False)  # fmt: skip
    names = list(_dual4_kernel.arg_names)
    types = dict(TYPES, x_ptr="*fp32") if epilogue == "layer_norm" else TYPES
    sig = {n: ("constexpr" if n in ce else ("*i32" if n == "q_ptr" and pack else types[n])) for n in names}
    attrs = {(names.index(n),): [["tt.divisibility", 16]] for n in ALIGNED}
    src = ASTSource(_dual4_kernel, sig, constexprs={(names.index(k),): v for k, v in ce.items()}, attrs=attrs)
    opts = {"num_warps": cfg["num_warps"], **({"maxnreg": cfg["maxnreg"]} if "maxnreg" in cfg else {})}
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options=opts), cfg


def measure(epilogue: str, config: str) -> dict:
    k, cfg = compile_dual4(epilogue, config)
    with tempfile.TemporaryDirectory() as d:
        ptx, cubin = os.path.join(d, "k.ptx"), os.path.join(d, "k.cubin")
        open(ptx, "w").write(k.asm["ptx"])
        open(cubin, "wb").write(k.asm["cubin"])
        err = subprocess.run([f"{BIN}/ptxas", "-arch=sm_90a", "-v", ptx, "-o", os.devnull],
                             capture_output=True, text=True).stderr  # fmt: skip
        sass = subprocess.run([f"{BIN}/nvdisasm", "-c", cubin], capture_output=True, text=True).stdout
    ops = collections.Counter(m.group(2) for m in (re.match(r"\s*/\*[0-9a-f]{4,}\*/\s+(@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)", ln)
                                                   for ln in sass.splitlines()) if m)  # fmt: skip
    per_thread = 128 * 128 // (32 * cfg["num_warps"])
    total = sum(ops.values())
    return {"epilogue": epilogue, "config": config, "registers": int(re.search(r"Used (\d+) registers", err).group(1)),
            "spill_bytes": int(re.search(r"(\d+) bytes spill stores", err).group(1)), "instructions": total,
            "per_element": total / per_thread, "top": dict(ops.most_common(8))}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--configs", default="four_w8,four_w8_pack,four_w8_r80,four_w8_pack_r80,four_w16_pack")
    a = ap.parse_args(argv)
    for config in a.configs.split(","):
        if config not in CONFIGS or CONFIGS[config]["kind"] != "four":
            ap.error(f"--configs: '{config}' is not a 'four' config of kernels.fp8block.quantize.CONFIGS")
        for epilogue in EPILOGUES:
            r = measure(epilogue, config)
            print(f"{config:18s} {epilogue:15s} regs {r['registers']:3d} spill {r['spill_bytes']:4d} B  "
                  f"{r['per_element']:5.1f} instr/element  {r['top']}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
