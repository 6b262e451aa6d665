"""Helpers every kernel bench shares (mxfp8, ffn), so that no kernel folder imports another's bench.

- ``Clock``: the bench's start and its ``say`` (lines stamped with the seconds since then);
- ``write_json`` / ``run_steps``: a bench's steps in order, the JSON rewritten whole after each;
- ``timer``: a median timer (``do_bench`` on CUDA, one warm and one timed call on the CPU);
- ``sm90_report``: compile a kernel for sm_90 without a GPU and print its resources.
"""

from __future__ import annotations

import json
import os
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class Clock:
    """When a bench started (its budget counts from there): made in ``main``, not at import."""

    start: float = field(default_factory=time.time)

    def elapsed(self) -> float:
        return time.time() - self.start

    def say(self, *a) -> None:
        print(f"[{self.elapsed():6.1f}s]", *a, flush=True)


def timer(dev):
    """``med(fn)``: seconds of ``fn``: a ``do_bench`` median on CUDA, one timed call after a warm
    one elsewhere (the smoke runs)."""
    if dev == "cuda":
        from triton.testing import do_bench

        return lambda fn: do_bench(fn, warmup=10, rep=40, return_mode="median") * 1e-3

    def cpu(fn):  # smoke: one warm call, then one timed
        fn()
        t = time.perf_counter()
        fn()
        return time.perf_counter() - t
    return cpu


def write_json(out: Path, name: str, res) -> None:
    """``<out>/<name>.json``, replaced whole (never half-written)."""
    tmp = out / f"{name}.json.tmp"
    tmp.write_text(json.dumps(res, indent=1, default=str))
    tmp.replace(out / f"{name}.json")


def run_steps(steps, res: dict, out: Path, name: str, say, *, deadline: float | None = None, after=None) -> None:
    """Run a bench's ``(step, fn)`` pairs in order. A step that raises goes to ``res["errors"]``
    with its traceback's tail and the others still run; past
    ``deadline`` a step is skipped (``res["skipped"]``); ``after`` runs after each step; and
    ``<out>/<name>.json`` is rewritten after each one, so a kill loses only the step it hit."""
    for step, fn in steps:
        if deadline is not None and time.time() > deadline:
            res.setdefault("skipped", []).append(step)
            say(f"budget: skipped {step}")
            continue
        try:
            fn()
        except Exception:  # noqa: BLE001
            tb = traceback.format_exc()[-1500:]
            res.setdefault("errors", []).append(f"{step}: {tb}")
            say(tb)
        if after is not None:
            after()
        write_json(out, name, res)


def sm90_report(label, fn, sig, consts, attrs, num_warps, elems, path) -> bool:
    """Compile ``fn`` for sm_90 (no GPU needed), print registers, spills, shared memory and SASS
    instructions per element (``elems`` per program); ``path``: where the PTX and cubin go."""
    import re
    import subprocess

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    bindir = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
    try:
        kern = triton.compile(ASTSource(fn, sig, constexprs=consts, attrs=attrs), target=GPUTarget("cuda", 90, 128),
                              options=dict(num_warps=num_warps))
        Path(path + ".ptx").write_text(kern.asm["ptx"])
        Path(path + ".cubin").write_bytes(kern.asm["cubin"])
        info = subprocess.run([f"{bindir}/ptxas", "-v", "--gpu-name", "sm_90a", path + ".ptx", "-o", path + ".o"],
                              capture_output=True, text=True).stderr
        sass = subprocess.run([f"{bindir}/cuobjdump", "-sass", path + ".cubin"], capture_output=True, text=True).stdout
        n = sum(1 for line in sass.splitlines() if re.match(r"\s+/\*[0-9a-f]{4}\*/", line))
        regs = re.search(r"Used (\d+) registers", info)
        spill = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", info)
        per = n / (elems / (32 * num_warps))
        print(f"OK   {label:28s} regs {regs.group(1) if regs else '?':>3}, spills "
              f"{spill.group(1) if spill else '?'}/{spill.group(2) if spill else '?'} B, smem {kern.metadata.shared:5d} B, "
              f"SASS {n:5d} instr = {per:4.1f} per element", flush=True)
        return True
    except Exception as e:  # noqa: BLE001
        print(f"FAIL {label}: {type(e).__name__}: {str(e)[-800:]}", flush=True)
        return False
