"""The compiled decode attention (rl_backend/serving/attention_kernel.py): it attends as torch's row-by-row products
do (to float32 rounding) and stores the new keys and values exactly, a row's result does not depend on its batch,
it is built once per source and CPU, and where it cannot be built agl says why and attends in torch."""

from __future__ import annotations

import logging
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from rl_backend.serving import attention_kernel  # noqa: E402
from rl_backend.serving.scripted import attend_rows  # noqa: E402


@pytest.fixture()
def kernel() -> attention_kernel.DecodeAttention:
    built = attention_kernel.load()
    assert built is not None, "the test machine has a C compiler: the kernel must build"
    return built


@pytest.fixture()
def fresh_build(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """An empty kernel cache and a forgotten `load()`, put back after (other tests use the real one)."""
    monkeypatch.setenv(attention_kernel.CACHE_ENV, str(tmp_path / "kernels"))
    attention_kernel.load.cache_clear()
    yield tmp_path / "kernels"
    attention_kernel.load.cache_clear()


def _batch(rows: int, heads: int, kv_heads: int, head_dim: int, layers: int = 3, seed: int = 0) -> dict[str, Any]:
    g = torch.Generator().manual_seed(seed)
    positions = [5 + 37 * r for r in range(rows)]  # lengths on and off the kernel's 8-lane blocks
    caches = [torch.randn(layers, 2, kv_heads, n + 9 + r, head_dim, generator=g) for r, n in enumerate(positions)]
    q = torch.randn(rows, heads, head_dim, generator=g) * head_dim**-0.5
    kv = torch.randn(rows, 2, kv_heads, head_dim, generator=g)
    return {"caches": caches, "positions": positions, "q": q, "kv": kv}


@pytest.mark.parametrize(("heads", "kv_heads", "head_dim", "sharpness"), [
    (9, 3, 64, 1.0), (4, 2, 16, 1.0), (4, 4, 8, 1.0), (16, 2, 128, 1.0), (4, 1, 24, 1.0),
    (9, 3, 64, 40.0),  # scores hundreds apart: most weights underflow to 0, as in torch's softmax
])
def test_kernel_attends_as_torch_row_by_row(kernel: Any, heads: int, kv_heads: int, head_dim: int,
                                            sharpness: float) -> None:
    b = _batch(4, heads, kv_heads, head_dim)
    b["q"] *= sharpness
    ours = [c.clone() for c in b["caches"]]
    theirs = [c.clone() for c in b["caches"]]
    attend = kernel.for_step(ours, b["positions"], heads, kv_heads, head_dim)
    assert attend is not None
    exact = [c.double() for c in b["caches"]]
    for layer in (0, 2):
        got = attend(layer, b["q"], b["kv"])
        want = attend_rows(b["q"], b["kv"], theirs, b["positions"], layer, kv_heads)
        truth = attend_rows(b["q"].double(), b["kv"].double(), exact, b["positions"], layer, kv_heads)
        assert got.shape == want.shape == (4, heads * head_dim)
        # As close to the float64 result as torch's float32 products are (sharper scores, larger rounding).
        ours_off, torch_off = (got - truth).abs().max().item(), (want - truth).abs().max().item()
        assert ours_off <= 2 * torch_off + 1e-6, (ours_off, torch_off)
        assert torch.allclose(got, want, rtol=1e-5, atol=1e-6 * sharpness), (got - want).abs().max()
    # The new keys and values are stored exactly where torch stores them, and nothing else is touched.
    assert all(torch.equal(a, b) for a, b in zip(ours, theirs, strict=True))


def test_a_rows_result_does_not_depend_on_its_batch(kernel: Any) -> None:
    b = _batch(5, 9, 3, 64, seed=1)
    together = kernel.for_step([c.clone() for c in b["caches"]], b["positions"], 9, 3, 64)(1, b["q"], b["kv"])
    for r in range(5):
        alone = kernel.for_step([b["caches"][r].clone()], [b["positions"][r]], 9, 3, 64)(
            1, b["q"][r : r + 1], b["kv"][r : r + 1])
        assert torch.equal(alone[0], together[r])


def test_caches_the_kernel_cannot_read_are_left_to_torch_and_bad_positions_refused(kernel: Any) -> None:
    b = _batch(2, 4, 2, 16)
    assert kernel.for_step([c.double() for c in b["caches"]], b["positions"], 4, 2, 16) is None
    assert kernel.for_step([c.transpose(3, 4) for c in b["caches"]], b["positions"], 4, 2, 16) is None
    with pytest.raises(ValueError, match="outside the caches' capacities"):
        kernel.for_step(b["caches"], [0, 10_000], 4, 2, 16)
    assert not attention_kernel.DecodeAttention.supports(4, 2, 12)  # head size not a multiple of 8


def test_built_once_per_source(fresh_build: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    first = attention_kernel._build()
    built_at = first.stat().st_mtime_ns
    assert first.parent == fresh_build and attention_kernel._build() == first
    assert first.stat().st_mtime_ns == built_at  # loaded from the cache, not rebuilt
    changed = tmp_path / "decode_attention.c"
    changed.write_text(attention_kernel.SOURCE.read_text() + "\n/* changed */\n")
    monkeypatch.setattr(attention_kernel, "SOURCE", changed)
    assert attention_kernel._build() != first


def _failing_compiler(folder: Path) -> str:
    script = folder / "broken-cc"
    script.write_text("#!/bin/sh\n[ \"$1\" = --version ] && exit 0\necho 'decode_attention.c:1: error: boom' >&2\nexit 1\n")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return str(script)


@pytest.mark.parametrize("compiler", ["missing", "failing"])
def test_without_a_working_compiler_agl_says_why_and_attends_in_torch(
    fresh_build: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
    compiler: str,
) -> None:
    monkeypatch.setenv("CC", "/nowhere/cc" if compiler == "missing" else _failing_compiler(tmp_path))
    with caplog.at_level(logging.WARNING, logger=attention_kernel.__name__):
        assert attention_kernel.load() is None
    said = caplog.text
    assert "attention runs row by row in torch" in said
    assert ("no C compiler '/nowhere/cc'" in said) if compiler == "missing" else ("error: boom" in said)
    assert not any(p.suffix == ".so" for p in fresh_build.glob("*"))  # no partial file left to load later


def test_env_switch_is_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(attention_kernel.ENV, "0")
    assert attention_kernel.enabled() is False
    monkeypatch.setenv(attention_kernel.ENV, "yes")
    with pytest.raises(ValueError, match=r"\$AGL_ATTENTION_KERNEL must be 0 or 1, got 'yes'"):
        attention_kernel.enabled()
    monkeypatch.delenv(attention_kernel.ENV)
    assert attention_kernel.enabled() is True
