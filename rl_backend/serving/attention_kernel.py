"""The decode step's attention as one small C function per layer, compiled on first use (decode_attention.c).

At 8 sequences, attending each row's one query over its own keys with torch's products makes about 20 calls per
row and layer whose fixed costs, not their arithmetic, took a third of a decode step. Padding the rows to one
length would make a single product of it, but a row's result would then depend on its neighbours' lengths, and the
engine promises that it does not. The C function loops over the rows, each in the same order whatever the batch
holds: batch invariant by construction, in a tenth of the time (README, Benchmarks).

It is compiled with the system's C compiler (`$CC`, else `cc`) for this CPU, once, into
`$AGL_KERNEL_CACHE` (default `~/.cache/agl/kernels`), named by a hash of the source, the compiler and the CPU, and
loaded with ctypes (no Python headers, no torch headers: about a second). Where there is no compiler, or it fails,
or `AGL_ATTENTION_KERNEL=0`, agl says so once and attends row by row with torch, which is slower and also batch
invariant. Its numbers differ from the row-by-row products' by float32 rounding (about 1e-6 relative).
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

import torch

log = logging.getLogger(__name__)

ENV = "AGL_ATTENTION_KERNEL"
CACHE_ENV = "AGL_KERNEL_CACHE"
SOURCE = Path(__file__).with_name("decode_attention.c")


def enabled() -> bool:
    """$AGL_ATTENTION_KERNEL: 1 (the default) uses the compiled kernel where it builds, 0 never does."""
    value = os.environ.get(ENV, "1").strip()
    if value not in ("0", "1"):
        raise ValueError(f"${ENV} must be 0 or 1, got {value!r}")
    return value == "1"


def cache_dir() -> Path:
    env = os.environ.get(CACHE_ENV, "").strip()
    return Path(env) if env else Path.home() / ".cache" / "agl" / "kernels"


class DecodeAttention:
    """The loaded kernel: `for_step` binds one decode step's caches and positions, then attends layer by layer."""

    def __init__(self, library: ctypes.CDLL, path: Path) -> None:
        self.path = path
        self._fn = library.agl_decode_attention
        self._fn.restype = None
        self._fn.argtypes = [ctypes.c_long] * 5 + [ctypes.c_void_p] * 7

    @staticmethod
    def supports(heads: int, kv_heads: int, head_dim: int) -> bool:
        return head_dim % 8 == 0 and heads % kv_heads == 0

    def for_step(self, caches: list[torch.Tensor], positions: list[int], heads: int, kv_heads: int,
                 head_dim: int, longest: int | None = None) -> KernelStep | None:
        """This step's arguments for the rows the kernel attends (`KernelStep`), or None where it attends none:
        a cache is not what the kernel reads, or every row is longer than `longest` keys (the caller attends
        those row by row in torch, whose products use every thread: faster once a row's keys no longer fit in
        the caches of one core). The rule is each row's own length, so a row's result never depends on its batch."""
        if not all(c.dtype == torch.float32 and c.device.type == "cpu" and c.is_contiguous() for c in caches):
            return None
        if any(not 0 <= n < int(c.shape[3]) for c, n in zip(caches, positions, strict=True)):
            raise ValueError(f"positions {positions} outside the caches' capacities {[int(c.shape[3]) for c in caches]}")
        rows = [r for r, n in enumerate(positions) if longest is None or n < longest]
        if not rows:
            return None
        return KernelStep(self, rows, [caches[r] for r in rows], [positions[r] for r in rows], heads, kv_heads)

    def attend(self, q: torch.Tensor, kv: torch.Tensor, step: list[torch.Tensor], layer: int,
               kv_heads: int) -> torch.Tensor:
        """One layer: `step` is a `KernelStep`'s tensors (cache addresses, capacities, positions, scratch)."""
        pointers, capacity, positions, scores = step
        q, kv = q.contiguous(), kv.contiguous()
        rows, heads, head_dim = q.shape
        out = torch.empty(rows, heads * head_dim)
        self._fn(rows, kv_heads, heads // kv_heads, head_dim, layer, q.data_ptr(), kv.data_ptr(), pointers.data_ptr(),
                 capacity.data_ptr(), positions.data_ptr(), out.data_ptr(), scores.data_ptr())
        return out


class KernelStep:
    """One decode step's arguments for the rows in `rows`, as the tensors the C function reads, made once rather
    than at each layer; `tensors` is what the scripted step passes to the registered operator."""

    def __init__(self, kernel: DecodeAttention, rows: list[int], caches: list[torch.Tensor], positions: list[int],
                 heads: int, kv_heads: int) -> None:
        self.kernel, self.rows, self.kv_heads = kernel, rows, kv_heads
        self.caches = caches  # C reads them through raw addresses: held here for as long as the step can be called
        self.tensors = [
            torch.tensor([c.data_ptr() for c in caches], dtype=torch.int64),
            torch.tensor([int(c.shape[3]) for c in caches], dtype=torch.int64),
            torch.tensor(positions, dtype=torch.int64),
            torch.empty(heads // kv_heads * ((max(positions) + 8) // 8 * 8)),  # scores, padded to whole blocks
        ]

    def __call__(self, layer: int, q: torch.Tensor, kv: torch.Tensor) -> torch.Tensor:
        """Attend `self.rows`' queries q [len(rows), heads, head_dim] with their new keys and values kv."""
        return self.kernel.attend(q, kv, self.tensors, layer, self.kv_heads)


@functools.cache
def register_operator() -> torch.library.Library:
    """`torch.ops.agl.decode_attention`, the kernel as an operator TorchScript can call: the scripted decode step
    then runs whole, returning to Python only for the C call itself (which holds no GIL while it computes)."""
    library = torch.library.Library("agl", "DEF")
    # (a!)/(b!) mark what the call writes (the caches behind the addresses, the scratch), so that no compiler of
    # the graph takes the call for a pure function of its inputs.
    library.define(
        "decode_attention(Tensor q, Tensor kv, Tensor(a!) pointers, Tensor capacity, Tensor positions, "
        "Tensor(b!) scores, int layer, int kv_heads) -> Tensor"
    )

    def run(q: torch.Tensor, kv: torch.Tensor, pointers: torch.Tensor, capacity: torch.Tensor,
            positions: torch.Tensor, scores: torch.Tensor, layer: int, kv_heads: int) -> torch.Tensor:
        kernel = load()
        if kernel is None:
            raise RuntimeError("agl::decode_attention was called without a built attention kernel")
        return kernel.attend(q, kv, [pointers, capacity, positions, scores], layer, kv_heads)

    library.impl("decode_attention", run, "CPU")
    return library


@functools.cache
def load() -> DecodeAttention | None:
    """The compiled kernel, built on first use, or None (said once, with the reason) where it cannot be."""
    try:
        path = _build()
        kernel = DecodeAttention(ctypes.CDLL(str(path)), path)
        register_operator()  # the decode step calls it as torch.ops.agl.decode_attention, scripted or not
        return kernel
    except (OSError, RuntimeError, subprocess.SubprocessError) as exc:
        log.warning("the decode attention kernel could not be built (%s): attention runs row by row in torch, "
                    "batch invariant but slower", exc)
        return None


def _build() -> Path:
    compiler = os.environ.get("CC", "").strip() or "cc"
    found = shutil.which(compiler)
    if found is None:
        raise RuntimeError(f"no C compiler {compiler!r} on PATH (set $CC, or install one: apt install gcc)")
    version = subprocess.run([found, "--version"], capture_output=True, text=True, timeout=30).stdout
    source = SOURCE.read_bytes()
    errors = []
    for flags in (["-O3", "-march=native"], ["-O3"]):  # -march=native where the compiler knows this CPU
        digest = hashlib.sha256(b"\0".join([source, version.encode(), " ".join(flags).encode(), _cpu().encode()]))
        target = _writable(cache_dir()) / f"decode_attention-{digest.hexdigest()[:16]}.so"
        if target.exists():
            return target
        # Built beside the target and renamed into place: processes starting together never load a partial file.
        with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
            built = Path(tmp) / target.name
            done = subprocess.run([found, *flags, "-fPIC", "-shared", "-o", str(built), str(SOURCE), "-lm"],
                                  capture_output=True, text=True, timeout=120)
            if done.returncode == 0:
                os.replace(built, target)
                log.info("compiled the decode attention kernel: %s", target)
                return target
            said = done.stderr.strip().splitlines()
            errors.append(f"{compiler} {' '.join(flags)}: {said[-1] if said else f'exit {done.returncode}'}")
    raise RuntimeError("; ".join(errors))


def _writable(folder: Path) -> Path:
    """`folder`, created, or a folder in the temporary directory where it cannot be (a read-only home)."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        if os.access(folder, os.W_OK):
            return folder
    except OSError:
        pass
    fallback = Path(tempfile.gettempdir()) / f"agl-kernels-{os.getuid() if hasattr(os, 'getuid') else 0}"
    fallback.mkdir(parents=True, exist_ok=True)
    return fallback


def _cpu() -> str:
    """What -march=native depends on: the CPU's model and feature flags."""
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor() or platform.machine()
    lines = [line for line in info.splitlines() if line.startswith(("model name", "flags", "Features", "CPU part"))]
    return "\n".join(sorted(set(lines)))
