"""The compiled operators between a decode step's products (`agl::add_rms_norm`, `agl::rotary`, `agl::silu_mul`,
rl_backend/serving/decode_attention.c): each computes what torch's operations compute, to float32 rounding, in the
dtype the next product takes; a row's result does not depend on its batch; what they cannot read they refuse with
a message that names it; and the decode step that uses them computes what the unfused step computes."""

from __future__ import annotations

import os
import shutil
from typing import Any

import pytest

torch = pytest.importorskip("torch")

import torch.nn.functional as F  # noqa: E402

from rl_backend.serving import decode_kernels  # noqa: E402
from rl_backend.serving.scripted import product_input, rotate  # noqa: E402

MODES = [0, 1, 2]  # float32, bfloat16, float32 rounded to bfloat16 (scripted.py)


@pytest.fixture(scope="module", autouse=True)
def native() -> None:
    if shutil.which(os.environ.get("CXX", "").strip() or "c++") is None:
        pytest.skip("no C++ compiler on this machine: the operators are not built (tests/test_attention_kernel.py "
                    "checks what agl does instead)")
    kernel = decode_kernels.load()
    assert kernel is not None and kernel.native, "the test machine has a C++ compiler: the operators must be native"


def _close(got: Any, want: Any, mode: int) -> None:
    assert got.dtype == want.dtype and got.shape == want.shape
    # float32: rounding apart; rounded to bfloat16: at most one bfloat16 step apart, where rounding went the other way
    rtol = 2e-6 if mode == 0 else 2**-7
    assert torch.allclose(got.float(), want.float(), rtol=rtol, atol=1e-6), (got.float() - want.float()).abs().max()


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("delta_dtype", ["float32", "bfloat16", "none"])
def test_add_rms_norm_adds_the_residual_and_norms_it_as_torch_does(mode: int, delta_dtype: str) -> None:
    g = torch.Generator().manual_seed(mode)
    x, weight = torch.randn(5, 64, generator=g) * 3, torch.randn(64, generator=g)
    delta = torch.empty(0, 0) if delta_dtype == "none" else torch.randn(5, 64, generator=g).to(getattr(torch, delta_dtype))
    total, normed = torch.ops.agl.add_rms_norm(x, delta, weight, 1e-5, mode)
    want_total = x if delta_dtype == "none" else x + delta.float()
    assert torch.equal(total, want_total)  # one addition per element, exactly as torch adds
    _close(normed, product_input(F.rms_norm(want_total, (64,), weight, 1e-5), mode), mode)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_rotary_rotates_queries_and_keys_scales_queries_and_keeps_values(dtype: str) -> None:
    heads, kv_heads, head_dim, rows = 9, 3, 64, 4
    g = torch.Generator().manual_seed(1)
    qkv = torch.randn(rows, (heads + 2 * kv_heads) * head_dim, generator=g).to(getattr(torch, dtype))
    angles = torch.rand(rows, head_dim // 2, generator=g) * 100
    angles = torch.cat((angles, angles), dim=-1)
    cos, sin = angles.cos(), angles.sin()
    q, kv = torch.ops.agl.rotary(qkv, cos, sin, heads, kv_heads, head_dim**-0.5)
    wide = qkv.float().view(rows, -1, head_dim)
    rotated = rotate(wide[:, : heads + kv_heads], cos.unsqueeze(1), sin.unsqueeze(1))
    _close(q.view(rows, heads, head_dim), rotated[:, :heads] * head_dim**-0.5, 0)
    kv = kv.view(rows, 2, kv_heads, head_dim)
    _close(kv[:, 0], rotated[:, heads:], 0)
    assert torch.equal(kv[:, 1], wide[:, heads + kv_heads :])  # values as they are


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_silu_mul_gates_as_torch_does_even_far_out(mode: int, dtype: str) -> None:
    g = torch.Generator().manual_seed(2)
    gate_up = torch.randn(3, 2 * 48, generator=g) * 4
    gate_up[0, :8] = torch.tensor([0.0, -0.0, 80.0, -80.0, 200.0, -200.0, 1e-30, -1e4])  # saturated and tiny gates
    gate_up = gate_up.to(getattr(torch, dtype))
    got = torch.ops.agl.silu_mul(gate_up, mode)
    wide = gate_up.float()
    want = product_input(F.silu(wide[:, :48]) * wide[:, 48:], mode)
    assert torch.isfinite(got.float()).all()
    _close(got, want, mode)


def test_a_rows_result_does_not_depend_on_its_batch() -> None:
    g = torch.Generator().manual_seed(3)
    x, delta, weight = torch.randn(6, 64, generator=g), torch.randn(6, 64, generator=g), torch.randn(64, generator=g)
    qkv, cos, sin = torch.randn(6, 5 * 16, generator=g), torch.randn(6, 16, generator=g), torch.randn(6, 16, generator=g)
    gate_up = torch.randn(6, 2 * 32, generator=g)
    together = [*torch.ops.agl.add_rms_norm(x, delta, weight, 1e-6, 1), *torch.ops.agl.rotary(qkv, cos, sin, 3, 1, 0.25),
                torch.ops.agl.silu_mul(gate_up, 0)]
    for r in range(6):
        row = slice(r, r + 1)
        alone = [*torch.ops.agl.add_rms_norm(x[row], delta[row], weight, 1e-6, 1),
                 *torch.ops.agl.rotary(qkv[row], cos[row], sin[row], 3, 1, 0.25), torch.ops.agl.silu_mul(gate_up[row], 0)]
        assert all(torch.equal(a[0], t[r]) for a, t in zip(alone, together, strict=True))


def test_what_the_operators_cannot_read_is_refused_by_name() -> None:
    x, weight = torch.randn(4, 64), torch.randn(64)
    cases = [
        (lambda: torch.ops.agl.add_rms_norm(x.t().contiguous().t(), torch.empty(0, 0), weight, 1e-5, 0),
         "agl::add_rms_norm: x must be contiguous"),
        (lambda: torch.ops.agl.add_rms_norm(x.double(), torch.empty(0, 0), weight, 1e-5, 0),
         "x must be a 2-dimensional float32 CPU tensor"),
        (lambda: torch.ops.agl.add_rms_norm(x, torch.randn(3, 64), weight, 1e-5, 0), "delta empty or \\[rows, d\\]"),
        (lambda: torch.ops.agl.add_rms_norm(torch.randn(4, 60), torch.empty(0, 0), torch.randn(60), 1e-5, 0),
         "d a multiple of 8"),
        (lambda: torch.ops.agl.add_rms_norm(x, torch.empty(0, 0), weight, 1e-5, 4), "mode must be 0, 1, 2 or 3"),
        (lambda: torch.ops.agl.rotary(torch.randn(2, 70), torch.randn(2, 16), torch.randn(2, 16), 3, 1, 1.0),
         "agl::rotary: qkv must be \\[rows, \\(heads \\+ 2 kv_heads\\) head_dim\\]"),
        (lambda: torch.ops.agl.rotary(torch.randn(2, 80).half(), torch.randn(2, 16), torch.randn(2, 16), 3, 1, 1.0),
         "qkv must be a 2-dimensional float32 or bfloat16 CPU tensor"),
        (lambda: torch.ops.agl.silu_mul(torch.randn(2, 12), 0), "f a multiple of 8"),
    ]
    for call, message in cases:
        with pytest.raises(RuntimeError, match=message):
            call()


def test_panel_product_is_the_float32_product_and_a_row_never_depends_on_its_batch() -> None:
    kernel = decode_kernels.load()
    assert kernel is not None
    width = kernel.panel_width
    assert width in (8, 16)
    g = torch.Generator().manual_seed(4)
    # 5 panels: items of 3 and 2 (AVX512) or 2, 2 and 1; an odd K
    weight, x = torch.randn(5 * width, 37, generator=g), torch.randn(21, 37, generator=g)
    panels = decode_kernels.pack_panels(weight, width)
    together = torch.ops.agl.panel_product(x, panels)
    exact = (x.double() @ weight.double().t()).float()
    assert together.shape == (21, 5 * width)
    assert torch.allclose(together, exact, rtol=1e-5, atol=1e-5), (together - exact).abs().max()
    for rows in (1, 2, 7, 8, 9, 16, 20):  # blocks of rows cut differently: every row keeps its bits
        assert torch.equal(torch.ops.agl.panel_product(x[:rows], panels), together[:rows])
    assert torch.equal(torch.ops.agl.panel_product(x[13:14], panels)[0], together[13])
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        assert torch.equal(torch.ops.agl.panel_product(x, panels), together)
    finally:
        torch.set_num_threads(threads)
    with pytest.raises(ValueError, match=f"a panel product needs a multiple of {width} outputs, not {width + 1}"):
        decode_kernels.pack_panels(torch.randn(width + 1, 4), width)
    with pytest.raises(RuntimeError, match=f"panels must be \\[panels, K, {width}\\] for x \\[rows, K\\]"):
        torch.ops.agl.panel_product(x[:, :36].contiguous(), panels)
