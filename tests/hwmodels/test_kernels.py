import pytest

from hwmodels import DEFAULT_EFFICIENCY, OP_CLASSES, get_gpu, kernel_cost, kernel_time_s

H200 = get_gpu("h200")


def test_every_op_class_has_a_default():
    assert set(DEFAULT_EFFICIENCY) == set(OP_CLASSES)
    assert all(0 < c <= 1 and 0 < m <= 1 for c, m in DEFAULT_EFFICIENCY.values())


def test_big_gemm_is_compute_bound_at_the_measured_rate():
    n = 8192
    cost = kernel_cost(op_class="gemm", flops=2 * n**3, bytes=3 * n * n * 2, gpu=H200, dtype="bf16")
    assert cost.bound == "compute"
    assert 2 * n**3 / (cost.time_s - cost.launch_s) == pytest.approx(780e12, rel=0.01)  # measured


def test_copy_is_memory_bound_at_the_measured_rate():
    nbytes = 2 * (1 << 30)  # read + write 1 GiB
    cost = kernel_cost(op_class="elementwise", flops=0, bytes=nbytes, gpu=H200, dtype="bf16", launch_s=0)
    assert cost.bound == "memory"
    assert nbytes / cost.time_s == pytest.approx(4.25e12, rel=0.01)  # measured


def test_roofline_takes_the_max_plus_launch():
    args = dict(op_class="gemm", gpu=H200, dtype="bf16", efficiency={"gemm": (1.0, 1.0)}, launch_s=1e-6)
    assert kernel_time_s(flops=989e12, bytes=4.8e9, **args) == pytest.approx(1.0 + 1e-6)
    assert kernel_time_s(flops=989e9, bytes=4.8e12, **args) == pytest.approx(1.0 + 1e-6)
    assert kernel_time_s(flops=0, bytes=0, **args) == pytest.approx(1e-6)


def test_non_tensor_core_classes_use_the_fp32_roof():
    t = kernel_time_s(op_class="norm", flops=67e12, bytes=0, gpu=H200, dtype="bf16",
                      efficiency={"norm": (1.0, 1.0)}, launch_s=0)
    assert t == pytest.approx(1.0)


def test_dtype_picks_the_peak():
    args = dict(op_class="gemm", flops=1e15, bytes=0, gpu=get_gpu("b200"), launch_s=0)
    assert kernel_time_s(dtype="bf16", **args) == pytest.approx(2 * kernel_time_s(dtype="mxfp8", **args))


def test_scale_multiplies_time_of_its_class_only():
    args = dict(flops=1e12, bytes=1e9, gpu=H200, dtype="bf16")
    assert kernel_time_s(op_class="gemm", scale={"gemm": 1.5}, **args) == pytest.approx(
        1.5 * kernel_time_s(op_class="gemm", **args))
    assert kernel_time_s(op_class="attention", scale={"gemm": 1.5}, **args) == kernel_time_s(op_class="attention", **args)


def test_bad_inputs():
    with pytest.raises(ValueError) as e:
        kernel_time_s(op_class="matmul", flops=1, bytes=1, gpu=H200, dtype="bf16")
    assert str(e.value) == ("unknown op_class 'matmul'; known: gemm, attention, embedding, elementwise, norm, "
                            "quantize, optimizer, other")
    with pytest.raises(ValueError, match=r"^GPU 'h200' has no peak for dtype 'fp4'"):
        kernel_time_s(op_class="gemm", flops=1, bytes=1, gpu=H200, dtype="fp4")
    with pytest.raises(ValueError, match=r"^kernel gemm: flops \(-1\) and bytes \(1\) must be >= 0"):
        kernel_time_s(op_class="gemm", flops=-1, bytes=1, gpu=H200, dtype="bf16")
