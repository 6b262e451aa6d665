"""Profiler events → op classes (executor.profiling.classify), by name and region."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from executor.profiling import classify


@dataclass
class Kernel:  # torch.autograd.profiler_util.Kernel: a GPU kernel a CPU-side event launched
    name: str


@dataclass
class Event:  # the fields classify reads from a torch.profiler FunctionEvent
    name: str
    cpu_parent: "Event | None" = None
    sequence_nr: int = -1
    kernels: tuple = ()


def _chain(*names: str) -> Event:
    """The last name's event, each earlier name its parent."""
    e = None
    for n in names:
        e = Event(n, e)
    return e


@pytest.mark.parametrize("names,cls", [
    (("CompiledFunction", "## Call CompiledFxGraph fabc ##", "triton_poi_fused_gelu_4"), "elementwise"),
    (("CompiledFunctionBackward", "## Call CompiledFxGraph f1 ##", "triton_red_fused_sum_4"), "elementwise"),
    (("CompiledFunction", "## Call CompiledFxGraph f2 ##", "triton_per_fused__to_copy_native_layer_norm_0"), "norm"),
    (("CompiledFunction", "## Call CompiledFxGraph f3 ##", "aten::mm"), "gemm"),
    (("attention.gdpa", "gemtwin::attention_gdpa_fwd"), "attention"),
    (("CompiledFunction", "## Call CompiledFxGraph f4 ##", "gemtwin::attention_gdpa_fwd"), "attention"),
    (("CompiledFunctionBackward", "## Call CompiledFxGraph f5 ##", "gemtwin::attention_asym_bwd"), "attention"),
    (("optimizer", "aten::_fused_adamw_"), "optimizer"),
    (("aten::index_select",), "other"),
    (("aten::add_",), "elementwise"),
    (("_MXFP8LinearFnBackward", "mxfp8.quantize", "_quantize_rows_kernel"), "quantize"),
    (("_MXFP8LinearFnBackward", "mxfp8.gemm", "_mx_mm_kernel"), "gemm"),
    (("CompiledFunction", "## Call CompiledFxGraph f6 ##", "_mx_mm_kernel_0"), "gemm"),
    (("CompiledFunction", "## Call CompiledFxGraph f7 ##", "gemtwin::bias_gelu"), "elementwise"),
    (("CompiledFunctionBackward", "## Call CompiledFxGraph f8 ##", "gemtwin::bias_gelu_bwd"), "elementwise"),
])  # fmt: skip
def test_compiled_kernels_get_their_class(names, cls):
    assert classify(_chain(*names), {}) == cls


@pytest.mark.parametrize("kernel,cls", [("_mx_mm_kernel", "gemm"), ("_quantize_rows4_kernel", "quantize"),
                                        ("_some_other_kernel", "other")])
def test_user_triton_kernels_in_compiled_graphs_are_classed_by_their_gpu_name(kernel, cls):
    """Inductor names the range of a user-defined Triton kernel "triton kernel" (s19: the MXFP8
    run's GEMMs and quantizers landed in ``other``): the kernel's own name decides."""
    e = _chain("CompiledFunction", "## Call CompiledFxGraph f9 ##", "triton kernel")
    e.kernels = (Kernel(kernel),)
    assert classify(e, {}) == cls


def test_packed_attention_ops_are_attributed_to_their_kind():
    """The executor's packed attention ops (traced into compiled graphs, where no
    ``record_function`` range survives) are attributed by their name: forward and backward time
    of a real profiled call lands in ``attention.<kind>``."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from executor.attention import packed_cross_attention, packed_self_attention
    from executor.profiling import kernel_times, op_class_times

    if torch.cuda.is_available():
        pytest.skip("the Triton interpreter is off where CUDA is present")
    offsets = torch.tensor([0, 5, 12])
    qkv = torch.randn(12, 3, 2, 16, requires_grad=True)
    q, kv = torch.randn(2, 4, 2, 16, requires_grad=True), torch.randn(12, 2, 2, 16, requires_grad=True)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        o = packed_self_attention(qkv, offsets, kind="gdpa", causal=True, block_size=0, activation="silu", max_len=7)
        x = packed_cross_attention(q, kv, offsets, jagged="kv", max_len=7)
        (o.sum() + x.sum()).backward()
    times = kernel_times(prof, per_steps=1)
    assert times.keys() == {"attention.gdpa", "attention.asym"} and min(times.values()) > 0
    assert op_class_times(prof, per_steps=1)["attention"] >= sum(times.values()) * 0.999


def test_mxfp8_linear_time_lands_in_gemm_and_quantize():
    """A profiled MXFP8 linear (forward, dgrad, wgrad; the CPU reference path) puts its matmuls in
    ``gemm`` and its quantization in ``quantize``, not in ``other`` (s16 on the H200 had 194 of
    280 ms in ``other`` before the ranges existed)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from executor.profiling import op_class_times
    from kernels.mxfp8.linear import MXFP8Linear

    lin = MXFP8Linear(64, 32, guard_calls=0)
    x = torch.randn(96, 64, requires_grad=True)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        lin(x).sum().backward()
    t = op_class_times(prof, per_steps=1)
    assert t["gemm"] > 0 and t["quantize"] > 0
    assert t["other"] < 0.2 * (t["gemm"] + t["quantize"]), t


@dataclass
class _FnEvent:  # a CPU-side torch.profiler FunctionEvent as _self_times reads it
    name: str
    kernels: list
    cpu_parent: "_FnEvent | None" = None
    sequence_nr: int = -1
    is_async: bool = False
    cpu_children: list = field(default_factory=list)

    def __post_init__(self):
        if self.cpu_parent is not None:
            self.cpu_parent.cpu_children.append(self)

    @property
    def device_type(self):
        from torch.autograd import DeviceType

        return DeviceType.CPU


def test_gpu_time_is_counted_once_per_kernel_and_range_mirrors_are_not_work():
    """On CUDA each GPU event counts once, for the op that launched it. The GPU-side mirror of a
    ``record_function`` range, which torch files as a "kernel" of the range bearing its name, is
    a span, not work; an Inductor kernel's launch range bears its kernel's name too, but is
    work. Kernels torch also files under a CUDA runtime call are the op's. The MoE's grouped GEMMs are ``gemm``; the sparse Adagrad fused into the embedding
    backward is ``embedding``, as the twin prices it, and so is the TBE's forward kernel under its
    ``PooledLookup``. The per-class kernel lists add up to the class times."""
    from torch.autograd.profiler_util import Kernel as K

    from executor.profiling import op_class_kernels, op_class_times

    step = _FnEvent("optimizer", [K("optimizer", 0, 900.0)])
    adam = _FnEvent("aten::_fused_adamw_", [K("multi_tensor_apply_kernel", 0, 300.0)], cpu_parent=step)
    graph = _FnEvent("## Call CompiledFxGraph f1 ##", [K("## Call CompiledFxGraph f1 ##", 0, 5000.0)])
    mm = _FnEvent("aten::mm", [K("nvjet_sm90_tst_256x128", 0, 1000.0)] * 2, cpu_parent=graph)
    ln = "triton_per_fused__to_copy_add_native_layer_norm_3"
    norm = _FnEvent(ln, [K(ln, 0, 400.0)], cpu_parent=graph)
    moe = _FnEvent("aten::_grouped_mm", [K("cutlass_device_kernel_GroupProblemShape", 0, 600.0)], cpu_parent=graph)
    emb = _FnEvent("_TableBatchedLookupBackward", [])
    ada = _FnEvent("triton kernel", [K("_adagrad_chunks_kernel", 0, 200.0)], cpu_parent=emb)
    fwd = _FnEvent("PooledLookup", [K("_pooled_fwd_kernel", 0, 80.0)])
    copy = _FnEvent("aten::copy_", [K("Memcpy HtoD (Pinned -> Device)", 0, 50.0)])
    odd = _FnEvent("aten::index_select", [K("vectorized_gather_kernel", 0, 30.0)])
    # a runtime call made outside any op, its correlation id matching the mm's (torch 2.11)
    runtime = _FnEvent("cudaEventRecordWithFlags", [K("nvjet_sm90_tst_256x128", 0, 1000.0)])

    class Prof:
        def events(self):
            return [step, adam, graph, mm, norm, moe, emb, ada, fwd, copy, odd, runtime]

    t = op_class_times(Prof(), per_steps=2, device="cuda")
    assert t["optimizer"] == pytest.approx(300 / 2e6) and t["gemm"] == pytest.approx((2000 + 600) / 2e6)
    assert t["embedding"] == pytest.approx((200 + 80) / 2e6)
    assert t["norm"] == pytest.approx(200e-6) and t["other"] == pytest.approx((50 + 30) / 2e6)  # the upload, a gather
    assert sum(t.values()) == pytest.approx((300 + 2000 + 400 + 600 + 200 + 80 + 50 + 30) / 2e6)
    k = op_class_kernels(Prof(), per_steps=2, device="cuda")
    assert k["gemm"] == {"nvjet_sm90_tst_256x128": pytest.approx(1000e-6),
                         "cutlass_device_kernel_GroupProblemShape": pytest.approx(300e-6)}
    assert list(k["optimizer"]) == ["multi_tensor_apply_kernel"]
    assert set(k["embedding"]) == {"_adagrad_chunks_kernel", "_pooled_fwd_kernel"}
    assert list(k["other"]) == ["aten::copy_: Memcpy HtoD (Pinned -> Device)", "aten::index_select: vectorized_gather_kernel"]
    assert {c: sum(v.values()) for c, v in k.items()} == pytest.approx({c: v for c, v in t.items() if v})


def test_gemms_with_the_gelu_in_their_epilogues_are_gemm_time():
    """The cuBLASLt FFN (``gemtwin::gelu_ffn``, ``kernels.ffn.epilogue``): its op's name says GELU,
    but its GEMM kernels are GEMM work (the GELU rides in their epilogues); the bias gradient's
    reduction under it stays element-wise."""
    from torch.autograd.profiler_util import Kernel as K

    from executor.profiling import op_class_times

    fwd = _FnEvent("gemtwin::gelu_ffn", [K("nvjet_sm90_tst_128x192_64x5_2x1_v_bz_coopB_geluauxbias_auxt_TNN", 0, 900.0),
                                         K("nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_bias_TNT", 0, 500.0)])
    bwd = _FnEvent("gemtwin::gelu_ffn_bwd", [
        K("sm90_xmma_gemm_bf16bf16_bf16f32_f32_nn_n_tilesize128x128x64_warpgroupsize1x1x1_aux_bf16_dg", 0, 950.0),
        K("void cublasLt::splitKreduce_kernel<32, 16, int, float>", 0, 10.0),
        K("void at::native::reduce_kernel<128, 4>", 0, 400.0)])

    class Prof:
        def events(self):
            return [fwd, bwd]

    t = op_class_times(Prof(), per_steps=1, device="cuda")
    assert t["gemm"] == pytest.approx((900 + 500 + 950 + 10) * 1e-6)
    assert t["elementwise"] == pytest.approx(400e-6)


@pytest.mark.gpu
def test_gpu_class_times_do_not_exceed_the_gpu_time_they_profile():
    """A real CUDA profile: the kernels inside a ``record_function`` range are counted once, so
    the classes add up to no more than the GPU time the range took (CUDA events)."""
    import torch
    from torch.autograd.profiler import record_function
    from torch.profiler import ProfilerActivity, profile

    from executor.profiling import op_class_kernels, op_class_times

    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    # 8192^3 GEMMs (~1.5 ms each): the GPU, not the profiled host's launches, sets the pace
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16) * 8192**-0.5
    a @ a
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        start.record()
        with record_function("optimizer"):
            for _ in range(10):
                a = (a @ a).mul_(1.0)
        stop.record()
        torch.cuda.synchronize()
    elapsed = start.elapsed_time(stop) * 1e-3
    t = op_class_times(prof, per_steps=1, device="cuda")
    assert 0.5 * elapsed < t["optimizer"] <= 1.05 * elapsed, (t, elapsed)
    assert sum(t.values()) <= 1.05 * elapsed, (t, elapsed)
    assert any(k.startswith(("nvjet", "sm90", "cutlass", "ampere")) or "gemm" in k.lower()
               for k in op_class_kernels(prof, per_steps=1, device="cuda")["optimizer"])


# ---- libkineto's USDT notices ------------------------------------------------------------------
def _profile_once() -> None:
    import torch
    from torch.profiler import ProfilerActivity, profile

    prof = profile(activities=[ProfilerActivity.CPU])
    prof.start()
    torch.ones(4).sum()
    prof.stop()


def test_kineto_notices_are_dropped_and_other_stderr_lines_kept(capfd):
    import os

    from executor.profiling import without_kineto_notices

    with without_kineto_notices():
        os.write(2, b"USDT:2026-12-01 21:36:03 7392:7392 SyncActivityProfilerHandler.cpp:52] profiler_start\n")
        os.write(2, b"a warning worth reading\n")
    assert capfd.readouterr().err == "a warning worth reading\n"


def test_a_profiled_start_and_stop_print_no_usdt_lines(capfd):
    from executor.profiling import without_kineto_notices

    _profile_once()
    if "USDT:" not in capfd.readouterr().err:
        pytest.skip("this torch's profiler prints no USDT lines")
    with without_kineto_notices():
        _profile_once()
    assert "USDT" not in capfd.readouterr().err
