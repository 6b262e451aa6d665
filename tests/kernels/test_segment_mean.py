"""``kernels.jagged.segment_mean`` against a float64 per-sample mean, forward and backward:
length-0 samples, padding rows past the last sample (zero gradient), bf16 and fp32."""

from __future__ import annotations

import pytest
import torch

from kernels.jagged.segment_mean import segment_mean


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_segment_mean_matches_per_sample_mean(dtype, device):
    if device == "cpu" and torch.cuda.is_available():
        pytest.skip("the Triton interpreter is off where CUDA is present")
    g = torch.Generator().manual_seed(0)
    lens, pad, D = [7, 0, 40, 1, 33], 9, 200  # D: more than one column block, not a power of two
    offsets = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()])
    x64 = torch.randn(sum(lens) + pad, D, generator=g, dtype=torch.float64)
    grad = torch.randn(len(lens), D, generator=g, dtype=torch.float64)
    x = x64.to(dtype).to(device).requires_grad_()
    out = segment_mean(x, offsets.to(device))
    (out * grad.to(dtype).to(device)).sum().backward()
    ref_x = x64.to(dtype).double().requires_grad_()
    ref = torch.stack([ref_x[a:b].mean(0) if b > a else ref_x.new_zeros(D)
                       for a, b in zip(offsets[:-1].tolist(), offsets[1:].tolist())])
    (ref * grad.to(dtype).double()).sum().backward()
    tol = dict(rtol=1e-5, atol=1e-6) if dtype == torch.float32 else dict(rtol=2e-2, atol=2e-2)
    assert out.dtype == dtype and out.shape == (len(lens), D)
    torch.testing.assert_close(out.double().cpu(), ref.detach(), **tol)
    torch.testing.assert_close(x.grad.double().cpu(), ref_x.grad, **tol)
    assert not x.grad[sum(lens):].any() and not out[1].any()  # padding: no gradient; length 0: zeros


def test_segment_mean_rejects_a_bad_layout():
    with pytest.raises(ValueError, match="^segment_mean: x has shape \\(4, 3, 2\\)"):
        segment_mean(torch.zeros(4, 3, 2), torch.tensor([0, 4]))
