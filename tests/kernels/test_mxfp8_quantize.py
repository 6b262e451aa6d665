"""MXFP8 quantize launch table: every variant bit-exact vs ``quantize_ref`` at tiny shapes (Triton
interpreter on CPU: masked and unmasked paths, both dims, E4M3/E5M2, NaN/Inf and zero blocks),
the layout dispatch, the errors, and the GPU bench's CPU smoke mode."""

from __future__ import annotations

import json
import os

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before any triton.jit in kernels.mxfp8 is created

from kernels.mxfp8.quantize import DEFAULT, FAMILY, VARIANTS, layout_kind, quantize  # noqa: E402
from kernels.mxfp8.reference import quantize_ref  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"


def _x(shape, seed, dtype=torch.bfloat16):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g) * torch.logspace(-30, 30, shape[1])[None, :]
    x[0, : min(32, shape[1])] = 0  # a zero block (dim=1)
    if shape[0] > 5 and shape[1] > 5:
        x[3, 2] = float("nan")
        x[5, shape[1] - 1] = float("-inf")
    return x.to(dtype).to(DEV)


def _assert_exact(x, dim, elem="e4m3", **kw):
    d, s = quantize(x, dim, elem, **kw)
    dr, sr = quantize_ref(x, dim, elem)
    assert d.shape == dr.shape and s.shape == sr.shape
    assert torch.equal(s.cpu(), sr.cpu())
    assert torch.equal(d.view(torch.uint8).cpu(), dr.view(torch.uint8).cpu())


def _cases(variant):
    """(shape of a row-major x, dim) that reach the variant's masked and unmasked paths."""
    c = VARIANTS[variant]
    fam = FAMILY[c["kernel"]]
    if fam == "rows":  # dim=1; (NB/4, 128): nblocks == NB, the unmasked (EVEN) path of rows4
        return [((12, 40), 1), ((7, 96), 1), ((c["NB"] // 4, 128), 1)]
    if fam == "cols":  # dim=0 of [K, C]; (32·G, BC): the unmasked path
        return [((40, 12), 0), ((70, 33), 0), ((32 * c["G"], c["BC"]), 0)]
    return [((12, 40), 1), ((40, 12), 0)]


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_every_variant_bit_exact(variant):
    for i, (shape, dim) in enumerate(_cases(variant)):
        _assert_exact(_x(shape, i), dim, variant=variant)
    shape, dim = _cases(variant)[0]
    _assert_exact(_x(shape, 7, torch.float32), dim, "e5m2", variant=variant)


def test_defaults_serve_their_layout():
    assert set(DEFAULT) == {"rows", "cols", "tile"}
    for kind, v in DEFAULT.items():
        assert FAMILY[VARIANTS[v]["kernel"]] == kind


def test_dispatch_by_layout():
    x = _x((40, 72), 3)
    assert layout_kind(x) == "rows" and layout_kind(x.t()) == "cols"
    assert layout_kind(x[:, ::2]) == "tile"
    for dim in (0, 1):
        _assert_exact(x, dim)  # rows (dim=1), cols (dim=0)
        _assert_exact(x.t(), dim)  # a column-major view: cols (dim=1), rows (dim=0)
        _assert_exact(x[:, ::2], dim)  # generic strides: the tile kernel
    wide = _x((9, 100), 4)[:, :64]  # row stride 100 != 64: the rows kernel's non-flat path
    _assert_exact(wide, 1)
    _assert_exact(_x((1, 1), 5), 0)
    _assert_exact(_x((1, 1), 5), 1)


def test_old_interface_and_errors():
    x = _x((20, 70), 6)
    _assert_exact(x, 1, BR=32, G=2, num_warps=4)  # BR/G alone: the tile kernel, as before
    _assert_exact(x, 1, variant="rows4_nb128_w4", num_warps=2)  # num_warps overrides the table's
    with pytest.raises(ValueError, match="variant 'nope' is unknown"):
        quantize(x, 1, variant="nope")
    with pytest.raises(ValueError, match="needs a 'rows' layout; this input is 'cols'"):
        quantize(x, 0, variant=DEFAULT["rows"])
    with pytest.raises(ValueError, match="needs a 'cols' layout; this input is 'rows'"):
        quantize(x, 1, variant=DEFAULT["cols"])
    empty_d, empty_s = quantize(torch.zeros(0, 64, device=DEV), 1)
    assert empty_d.shape == (0, 64) and empty_s.shape == (0, 2)


def test_bench_quantize_smoke(tmp_path):
    from kernels.mxfp8 import bench_quantize

    if DEV == "cuda":
        pytest.skip("the smoke mode is the CPU path; on a GPU run the bench itself")
    rc = bench_quantize.main(["--smoke", "--out", str(tmp_path), "--variants", "tile_br64_g4_w8"])
    res = json.loads((tmp_path / "bench_quantize.json").read_text())
    assert rc == 0 and res["all_bit_exact"] and not res["unchecked"]
    names = {r["variant"] for r in res["check"]}
    assert {"tile_br64_g4_w8", DEFAULT["rows"], DEFAULT["cols"]} <= names
    t = res["timing"][0]
    assert t["copy_TBps"] > 0 and all("time_s" in r for r in t["dim1"] + t["dim0"])


def test_bench_steps_record_errors_skip_past_the_deadline_and_keep_the_json(tmp_path):
    """The kernel benches' step runner: a failing step is recorded and the next still runs, a
    step past the deadline is skipped (in ``res``), and the JSON on disk holds every step run."""
    import time

    from kernels.common.bench import run_steps

    res, said, after = {}, [], []

    def boom():
        raise RuntimeError("kernel failed")

    steps = [("a", lambda: res.update(a=1)), ("b", boom), ("c", lambda: res.update(c=3))]
    run_steps(steps, res, tmp_path, "bench_x", said.append, after=lambda: after.append(1))
    on_disk = json.loads((tmp_path / "bench_x.json").read_text())
    assert on_disk["a"] == 1 and on_disk["c"] == 3 and len(after) == 3
    assert len(on_disk["errors"]) == 1 and on_disk["errors"][0].startswith("b: ") and "kernel failed" in said[0]
    run_steps([("d", lambda: res.update(d=4))], res, tmp_path, "bench_x", said.append, deadline=time.time() - 1)
    assert "d" not in res and res["skipped"] == ["d"] and "budget: skipped d" in said
