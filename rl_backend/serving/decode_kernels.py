"""The fast runner's compiled decode kernels, built on first use: its attention (decode_attention.c) and, where a
C++ compiler is found, the torch operators of decode_ops.cpp.

Attention: at 8 sequences, attending each row's one query over its own keys with torch's products makes about 20
calls per row and layer whose fixed costs, not their arithmetic, took a third of a decode step. Padding the rows to
one length would make a single product of it, but a row's result would then depend on its neighbours' lengths, and
the engine promises that it does not. The kernel computes every (row, key head) pair in the same order whatever the
batch holds: batch invariant by construction, in a tenth of the time (README, Benchmarks). It is the operator
`agl::decode_attention`.

Where a C++ compiler is found (`$CXX`, else `c++`), decode_ops.cpp (which includes the attention) is built and
registers its operators' CPU kernels through torch's stable C ABI: the attention with its pairs shared among
torch's intra-op threads, the operations between a decode step's products (`agl::add_rms_norm`, `agl::rotary`,
`agl::silu_mul`, used by `scripted.fused_layers`) and float32 products on weights packed in panels
(`agl::panel_product`, `pack_panels`). The scripted decode step then calls them without Python and without the GIL
(which the server's event loop, streaming on another thread, holds half the time). Otherwise the attention alone is
built as C (`$CC`, else `cc`) and its operator is a Python function calling it through ctypes on one thread (the
same arithmetic, the same bits), and the rest of the step runs torch's operations and oneDNN's products. Either is
built once into `$AGL_KERNEL_CACHE` (default `~/.cache/agl/kernels`), named by a hash of the sources, the compiler,
its flags and the CPU (no torch headers are read: a few seconds). Where neither compiler works, or
`AGL_ATTENTION_KERNEL=0`, agl says so once and computes the step with torch alone, which is slower and also batch
invariant. The compiled kernels' numbers differ from torch's by float32 rounding (about 1e-6 relative).
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

from .compilers import kernel_compilers

log = logging.getLogger(__name__)

ENV = "AGL_ATTENTION_KERNEL"
CACHE_ENV = "AGL_KERNEL_CACHE"
SOURCE = Path(__file__).with_name("decode_attention.c")
OPS_SOURCE = Path(__file__).with_name("decode_ops.cpp")  # includes SOURCE


def enabled() -> bool:
    """$AGL_ATTENTION_KERNEL: 1 (the default) uses the compiled kernel where it builds, 0 never does."""
    value = os.environ.get(ENV, "1").strip()
    if value not in ("0", "1"):
        raise ValueError(f"${ENV} must be 0 or 1, got {value!r}")
    return value == "1"


def cache_dir() -> Path:
    env = os.environ.get(CACHE_ENV, "").strip()
    return Path(env) if env else Path.home() / ".cache" / "agl" / "kernels"


OPERATOR = "agl::decode_attention"


class DecodeKernels:
    """The loaded kernels: `for_step` binds one decode step's caches and positions, then attends layer by layer;
    `native` and `panel_width` say what else the build registered."""

    def __init__(self, library: ctypes.CDLL, path: Path, native: bool) -> None:
        self.path = path
        # The operator runs the kernel itself, on torch's threads (else through `attend`), and the operators between
        # the products (scripted.fused_layers) exist.
        self.native = native
        # Outputs per panel of `agl::panel_product` (16 where the CPU has AVX512, else 8); 0: no panel products.
        # (A C build loaded after the C++ one had registered the operators knows no width: no panels then.)
        self.panel_width = int(library.agl_panel_width()) if native and hasattr(library, "agl_panel_width") else 0
        self._fn = library.agl_decode_attention
        self._fn.restype = None
        self._fn.argtypes = [ctypes.c_long] * 5 + [ctypes.c_void_p] * 6

    @staticmethod
    def supports(heads: int, kv_heads: int, head_dim: int) -> bool:
        return head_dim % 8 == 0 and heads % kv_heads == 0

    def for_step(self, caches: list[torch.Tensor], positions: list[int], heads: int, kv_heads: int,
                 head_dim: int, longest: int | None = None) -> KernelStep | None:
        """This step's arguments for the rows the kernel attends (`KernelStep`), or None where it attends none:
        a cache is not what the kernel reads, or every row is longer than `longest` keys (the caller attends
        those row by row in torch). The rule is each row's own length, so a row's result never depends on its
        batch."""
        if not all(c.dtype == torch.float32 and c.device.type == "cpu" and c.is_contiguous() for c in caches):
            return None
        if any(not 0 <= n < int(c.shape[3]) for c, n in zip(caches, positions, strict=True)):
            raise ValueError(f"positions {positions} outside the caches' capacities {[int(c.shape[3]) for c in caches]}")
        rows = [r for r, n in enumerate(positions) if longest is None or n < longest]
        if not rows:
            return None
        return KernelStep(rows, [caches[r] for r in rows], [positions[r] for r in rows], kv_heads)

    def attend(self, q: torch.Tensor, kv: torch.Tensor, step: list[torch.Tensor], layer: int,
               kv_heads: int) -> torch.Tensor:
        """One layer on this thread through ctypes (the operator's Python kernel where it has no native one):
        `step` is a `KernelStep`'s tensors (cache addresses, capacities, positions)."""
        pointers, capacity, positions = step
        q, kv = q.contiguous(), kv.contiguous()
        # What the native operator checks (decode_ops.cpp): C would read any memory it is pointed at.
        if q.dtype != torch.float32 or q.dim() != 3 or kv.dtype != torch.float32:
            raise RuntimeError("agl::decode_attention: q must be a 3-dimensional float32 CPU tensor, kv float32")
        rows, heads, head_dim = q.shape
        if kv_heads < 1 or heads % kv_heads or head_dim % 8 or layer < 0:
            raise RuntimeError("agl::decode_attention: heads must be a multiple of kv_heads, head_dim of 8, and "
                               "layer at least 0")
        if kv.shape != (rows, 2, kv_heads, head_dim) or not len(pointers) == len(capacity) == len(positions) == rows:
            raise RuntimeError("agl::decode_attention: kv must be [rows, 2, kv_heads, head_dim] and pointers, "
                               "capacity and positions hold one entry per row of q")
        if bool(((positions < 0) | (positions >= capacity)).any()):
            raise RuntimeError("agl::decode_attention: a position lies outside its cache's capacity")
        out = torch.empty(rows, heads * head_dim)
        self._fn(rows, kv_heads, heads // kv_heads, head_dim, layer, q.data_ptr(), kv.data_ptr(), pointers.data_ptr(),
                 capacity.data_ptr(), positions.data_ptr(), out.data_ptr())
        return out


class KernelStep:
    """One decode step's arguments for the rows in `rows`, as the tensors the operator reads, made once rather
    than at each layer; `tensors` is what the scripted step passes to it."""

    def __init__(self, rows: list[int], caches: list[torch.Tensor], positions: list[int], kv_heads: int) -> None:
        self.rows, self.kv_heads = rows, kv_heads
        self.caches = caches  # the kernel reads them through raw addresses: held for as long as the step is used
        self.tensors = [
            torch.tensor([c.data_ptr() for c in caches], dtype=torch.int64),
            torch.tensor([int(c.shape[3]) for c in caches], dtype=torch.int64),
            torch.tensor(positions, dtype=torch.int64),
        ]

    def __call__(self, layer: int, q: torch.Tensor, kv: torch.Tensor) -> torch.Tensor:
        """Attend `self.rows`' queries q [len(rows), heads, head_dim] with their new keys and values kv."""
        pointers, capacity, positions = self.tensors
        return torch.ops.agl.decode_attention(q, kv, pointers, capacity, positions, layer, self.kv_heads)


@functools.cache
def register_operator() -> torch.library.Library:
    """The schema of `torch.ops.agl.decode_attention` (what TorchScript needs to compile a call to it); its kernel
    is registered when the compiled function loads (`load`)."""
    library = torch.library.Library("agl", "DEF")
    # (a!) marks what the call writes (the caches behind the addresses), so that no compiler of the graph takes
    # the call for a pure function of its inputs.
    library.define(
        "decode_attention(Tensor q, Tensor kv, Tensor(a!) pointers, Tensor capacity, Tensor positions, "
        "int layer, int kv_heads) -> Tensor"
    )
    # The operations between a decode step's products (scripted.fused_layers); native kernels only.
    library.define("add_rms_norm(Tensor x, Tensor delta, Tensor weight, float eps, int mode) -> (Tensor, Tensor)")
    library.define("rotary(Tensor qkv, Tensor cos, Tensor sin, int heads, int kv_heads, float scale) -> (Tensor, Tensor)")
    library.define("silu_mul(Tensor gate_up, int mode) -> Tensor")
    library.define("panel_product(Tensor x, Tensor panels) -> Tensor")  # float32 products (pack_panels)
    return library


def pack_panels(weight: torch.Tensor, width: int) -> torch.Tensor:
    """A float32 weight [N, K] as `agl::panel_product` reads it: [N / width, K, width], each panel the `width`
    outputs' weights of every k together. N must be a multiple of `width`."""
    n, k = weight.shape
    if n % width:
        raise ValueError(f"a panel product needs a multiple of {width} outputs, not {n}")
    return weight.detach().float().reshape(n // width, width, k).transpose(1, 2).contiguous()


class _TorchApi(ctypes.Structure):
    """decode_attention.c's `struct torch_api`: the stable C ABI functions it calls, by address, and four codes."""

    FUNCTIONS = (
        "aoti_torch_library_init_impl", "aoti_torch_library_impl", "aoti_torch_get_data_ptr", "aoti_torch_get_dim",
        "aoti_torch_get_sizes", "aoti_torch_get_strides", "aoti_torch_get_dtype", "aoti_torch_get_device_type",
        "aoti_torch_empty_strided", "aoti_torch_delete_tensor_object", "torch_parallel_for",
    )
    _fields_ = [(name, ctypes.c_void_p) for name in FUNCTIONS] + [
        ("float32", ctypes.c_int32), ("int64", ctypes.c_int32), ("cpu", ctypes.c_int32), ("bfloat16", ctypes.c_int32)]


def _register_native(library: ctypes.CDLL) -> str | None:
    """Register the built C++'s kernel for the operator; None if done, else why not."""
    if not hasattr(library, "agl_register_operator"):
        return "it was built as C (no C++ compiler)"
    try:
        torch_lib = ctypes.CDLL(str(Path(torch.__file__).parent / "lib" / "libtorch_cpu.so"))
        api = _TorchApi(*[ctypes.cast(getattr(torch_lib, name), ctypes.c_void_p) for name in _TorchApi.FUNCTIONS])
        for field, getter in (("float32", "aoti_torch_dtype_float32"), ("int64", "aoti_torch_dtype_int64"),
                              ("cpu", "aoti_torch_device_type_cpu"), ("bfloat16", "aoti_torch_dtype_bfloat16")):
            code = getattr(torch_lib, getter)
            code.restype = ctypes.c_int32
            setattr(api, field, code())
    except (OSError, AttributeError) as exc:  # another torch build, or one before 2.10 (no torch_parallel_for)
        return f"this torch has no stable C ABI to register it with ({exc})"
    register = library.agl_register_operator
    register.restype, register.argtypes = ctypes.c_int, [ctypes.POINTER(_TorchApi)]
    status = register(ctypes.byref(api))
    return None if status == 0 else f"torch refused its registration (status {status})"


def _register_kernel(library: ctypes.CDLL) -> bool:
    """Give the operator a CPU kernel, once per process (later loads find it there); True if it is the native one."""
    register_operator()
    if not torch._C._dispatch_has_kernel_for_dispatch_key(OPERATOR, "CPU"):
        why_not = _register_native(library)
        if why_not is not None:
            log.info("the decode attention kernel runs through Python on one thread: %s", why_not)

            def run(q: torch.Tensor, kv: torch.Tensor, pointers: torch.Tensor, capacity: torch.Tensor,
                    positions: torch.Tensor, layer: int, kv_heads: int) -> torch.Tensor:
                kernel = load()
                if kernel is None:
                    raise RuntimeError("agl::decode_attention was called without a built attention kernel")
                return kernel.attend(q, kv, [pointers, capacity, positions], layer, kv_heads)

            register_operator().impl("decode_attention", run, "CPU")
    # torch's registry, which is process-wide, says which: the native kernel registered under its source's name.
    return OPS_SOURCE.name in torch._C._dispatch_dump(OPERATOR)


@functools.cache
def load() -> DecodeKernels | None:
    """The compiled kernel, built on first use, or None (said once, with the reason) where it cannot be."""
    try:
        path = _build()
        library = ctypes.CDLL(str(path))
        return DecodeKernels(library, path, _register_kernel(library))
    except (OSError, RuntimeError, subprocess.SubprocessError) as exc:
        log.warning("the decode attention kernel could not be built (%s): attention runs row by row in torch, "
                    "batch invariant but slower", exc)
        return None


def _compilers() -> list[tuple[str, str, Path, list[str]]]:
    """(language, compiler, source, flags) in the order tried: the C++ build registers the operators natively."""
    (_, cxx), (_, cc) = kernel_compilers()
    return [("C++", cxx, OPS_SOURCE, ["-x", "c++"]), ("C", cc, SOURCE, [])]


def _build() -> Path:
    errors = []
    sources = b"\0".join([SOURCE.read_bytes(), OPS_SOURCE.read_bytes()])
    for language, compiler, source, language_flags in _compilers():
        found = shutil.which(compiler)
        if found is None:
            errors.append(f"no {language} compiler {compiler!r} on PATH")
            continue
        version = subprocess.run([found, "--version"], capture_output=True, text=True, timeout=30).stdout
        for flags in ([*language_flags, "-O3", "-march=native"], [*language_flags, "-O3"]):  # -march=native where known
            digest = hashlib.sha256(b"\0".join([sources, version.encode(), " ".join(flags).encode(), _cpu().encode()]))
            target = _writable(cache_dir()) / f"decode_kernels-{digest.hexdigest()[:16]}.so"
            if target.exists():
                return target
            # Built beside the target and renamed into place: processes starting together never load a partial file.
            with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
                built = Path(tmp) / target.name
                done = subprocess.run(
                    [found, *flags, "-fPIC", "-shared", f"-I{SOURCE.parent}", "-o", str(built), str(source), "-lm"],
                    capture_output=True, text=True, timeout=120)
                if done.returncode == 0:
                    os.replace(built, target)
                    log.info("compiled the decode kernels as %s: %s", language, target)
                    return target
                said = done.stderr.strip().splitlines()
                errors.append(f"{compiler} {' '.join(flags)}: {said[-1] if said else f'exit {done.returncode}'}")
    raise RuntimeError("; ".join(errors) + " (install one: apt install g++, or set $CXX or $CC)")


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
