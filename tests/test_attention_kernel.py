"""The compiled decode attention (rl_backend/serving/decode_kernels.py): it attends as torch's row-by-row products
do (to float32 rounding) and stores the new keys and values exactly, a row's result does not depend on its batch,
it is built once per source and CPU, and where it cannot be built agl says why and attends in torch."""

from __future__ import annotations

import logging
import os
import shutil
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from rl_backend.serving import decode_kernels  # noqa: E402
from rl_backend.serving.scripted import attend_rows  # noqa: E402


@pytest.fixture()
def kernel() -> decode_kernels.DecodeKernels:
    built = decode_kernels.load()
    assert built is not None, "the test machine has a C compiler: the kernel must build"
    return built


@pytest.fixture()
def fresh_build(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """An empty kernel cache and a forgotten `load()`, put back after (other tests use the real one)."""
    monkeypatch.setenv(decode_kernels.CACHE_ENV, str(tmp_path / "kernels"))
    decode_kernels.load.cache_clear()
    yield tmp_path / "kernels"
    decode_kernels.load.cache_clear()


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


@pytest.mark.parametrize("path", ["operator", "ctypes"])
def test_a_sequences_next_positions_in_one_call_give_the_bits_of_one_call_each(kernel: Any, path: str) -> None:
    # A draft being checked (engine.py) feeds one sequence at several consecutive positions in one step: each row
    # must read the keys the rows before it store, whichever thread attends it, and come out as one token a step.
    b = _batch(4, 9, 3, 64, seed=3)
    cache, start = b["caches"][3], b["positions"][3]

    def attend(caches: list[Any], positions: list[int], q: Any, kv: Any) -> Any:
        step = kernel.for_step(caches, positions, 9, 3, 64)
        return step(1, q, kv) if path == "operator" else kernel.attend(q, kv, step.tensors, 1, 3)

    together_cache = cache.clone()
    together = attend([together_cache] * 4, [start + i for i in range(4)], b["q"], b["kv"])
    one_by_one_cache = cache.clone()
    for i in range(4):
        alone = attend([one_by_one_cache], [start + i], b["q"][i : i + 1], b["kv"][i : i + 1])
        assert torch.equal(alone[0], together[i]), i
    assert torch.equal(together_cache, one_by_one_cache)


def test_caches_the_kernel_cannot_read_are_left_to_torch_and_bad_positions_refused(kernel: Any) -> None:
    b = _batch(2, 4, 2, 16)
    assert kernel.for_step([c.double() for c in b["caches"]], b["positions"], 4, 2, 16) is None
    assert kernel.for_step([c.transpose(3, 4) for c in b["caches"]], b["positions"], 4, 2, 16) is None
    with pytest.raises(ValueError, match="outside the caches' capacities"):
        kernel.for_step(b["caches"], [0, 10_000], 4, 2, 16)
    assert not decode_kernels.DecodeKernels.supports(4, 2, 12)  # head size not a multiple of 8


def test_built_once_per_source(fresh_build: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    first = decode_kernels._build()
    built_at = first.stat().st_mtime_ns
    assert first.parent == fresh_build and decode_kernels._build() == first
    assert first.stat().st_mtime_ns == built_at  # loaded from the cache, not rebuilt
    changed = tmp_path / "decode_attention.c"
    changed.write_text(decode_kernels.SOURCE.read_text() + "\n/* changed */\n")
    monkeypatch.setattr(decode_kernels, "SOURCE", changed)
    assert decode_kernels._build() != first


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
    for variable, name in (("CXX", "c++"), ("CC", "cc")):
        monkeypatch.setenv(variable, f"/nowhere/{name}" if compiler == "missing" else _failing_compiler(tmp_path))
    with caplog.at_level(logging.WARNING, logger=decode_kernels.__name__):
        assert decode_kernels.load() is None
    said = caplog.text
    assert "attention runs row by row in torch" in said
    if compiler == "missing":
        assert "no C++ compiler '/nowhere/c++'" in said and "no C compiler '/nowhere/cc'" in said
    else:
        assert "error: boom" in said
    assert "apt install g++, or set $CXX or $CC" in said
    assert not any(p.suffix == ".so" for p in fresh_build.glob("*"))  # no partial file left to load later


@pytest.mark.skipif(shutil.which(os.environ.get("CXX", "").strip() or "c++") is None, reason="no C++ compiler")
def test_the_operator_runs_natively_on_every_thread_with_the_bits_of_the_one_thread_call(kernel: Any) -> None:
    assert kernel.native, "the test machine has a C++ compiler: the operator's kernel must be the native one"
    b = _batch(6, 9, 3, 64, seed=2)
    caches = [c.clone() for c in b["caches"]]
    step = kernel.for_step(caches, b["positions"], 9, 3, 64)
    threads = torch.get_num_threads()
    try:
        results = []
        for count in (1, 2, 3):
            torch.set_num_threads(count)
            results.append(step(2, b["q"], b["kv"]))
    finally:
        torch.set_num_threads(threads)
    one_thread = kernel.attend(b["q"], b["kv"], step.tensors, 2, 3)  # through ctypes, on this thread
    assert all(torch.equal(r, one_thread) for r in results)


@pytest.mark.parametrize("path", ["operator", "ctypes"])
def test_the_kernel_refuses_what_it_cannot_read_and_says_what(kernel: Any, path: str) -> None:
    if path == "operator" and not kernel.native:
        pytest.skip("no C++ compiler: the operator is the ctypes path")
    b = _batch(2, 4, 2, 16)
    step = kernel.for_step(b["caches"], b["positions"], 4, 2, 16)
    pointers, capacity, positions = step.tensors

    def attend(q: Any, kv: Any, pointers: Any, capacity: Any, positions: Any, layer: int, kv_heads: int) -> Any:
        if path == "operator":
            return torch.ops.agl.decode_attention(q, kv, pointers, capacity, positions, layer, kv_heads)
        return kernel.attend(q, kv, [pointers, capacity, positions], layer, kv_heads)

    if path == "operator":
        with pytest.raises(RuntimeError, match="q must be contiguous"):
            attend(b["q"].transpose(0, 1).contiguous().transpose(0, 1), b["kv"], pointers, capacity, positions, 0, 2)
    with pytest.raises(RuntimeError, match="q must be a 3-dimensional float32 CPU tensor"):
        attend(b["q"].double(), b["kv"], pointers, capacity, positions, 0, 2)
    with pytest.raises(RuntimeError, match="one entry per row of q"):
        attend(b["q"][:1], b["kv"][:1], pointers, capacity, positions, 0, 2)
    with pytest.raises(RuntimeError, match="heads must be a multiple of kv_heads"):
        attend(b["q"], b["kv"], pointers, capacity, positions, 0, 3)
    with pytest.raises(RuntimeError, match="outside its cache's capacity"):
        attend(b["q"], b["kv"], pointers, capacity, capacity.clone(), 0, 2)
    assert all(torch.equal(a, c) for a, c in zip(b["caches"], _batch(2, 4, 2, 16)["caches"], strict=True))


def test_without_a_cxx_compiler_the_operator_calls_the_c_build_through_python(tmp_path: Path) -> None:
    """The C build's path, in a process of its own (the operator's kernel is registered once per process)."""
    script = (
        "import logging\n"
        "import torch\n"
        "logging.basicConfig(level=logging.INFO)\n"
        "from rl_backend.serving import decode_kernels\n"
        "b = __import__('test_attention_kernel')._batch(3, 9, 3, 64, seed=3)\n"
        "k = decode_kernels.load()\n"
        "assert k is not None and not k.native, k\n"
        "step = k.for_step(b['caches'], b['positions'], 9, 3, 64)\n"
        "torch.save(step(1, b['q'], b['kv']), 'out.pt')\n"
    )
    env = {**os.environ, "CXX": "/nowhere/c++", decode_kernels.CACHE_ENV: str(tmp_path / "kernels"),
           "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent), str(Path(__file__).parents[1])])}
    done = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    assert "runs through Python on one thread: it was built as C (no C++ compiler)" in done.stderr
    b = _batch(3, 9, 3, 64, seed=3)
    native = decode_kernels.load()
    assert native is not None
    want = native.for_step(b["caches"], b["positions"], 9, 3, 64)(1, b["q"], b["kv"])
    assert torch.equal(torch.load(tmp_path / "out.pt"), want)


def test_env_switch_is_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(decode_kernels.ENV, "0")
    assert decode_kernels.enabled() is False
    monkeypatch.setenv(decode_kernels.ENV, "yes")
    with pytest.raises(ValueError, match=r"\$AGL_ATTENTION_KERNEL must be 0 or 1, got 'yes'"):
        decode_kernels.enabled()
    monkeypatch.delenv(decode_kernels.ENV)
    assert decode_kernels.enabled() is True
