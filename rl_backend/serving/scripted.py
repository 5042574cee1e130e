"""The fast runner's decode step compiled by TorchScript: the same kernels, called from C++ instead of Python.

At 8 sequences a decode step of a 30-layer model makes about 2,000 small torch calls (per-row attention, norms,
rotary embeddings, residuals). From Python each call pays the interpreter's dispatch and a GIL hand-over, and the
server's event loop, which streams the tokens on another thread, takes the GIL between them. Scripted, the step
runs whole in TorchScript's interpreter with the GIL released (the compiled attention is the operator
`agl::decode_attention`, see decode_kernels.py; only where it had no C++ compiler is that a call back into
Python): the same aten operations in the same order
(TorchScript fuses nothing on a CPU unless told to, and `compile_decode` declines when it was), so every row's token
ids and logprobs are bit for bit those of the Python step, alone or batched (tests/test_engine.py checks both).

`torch.jit.script` is deprecated in favour of `torch.compile`, which cannot lower the packed oneDNN weights (its
linear lowering asserts they are graph constants; see the README's serving notes). Where scripting fails, the
runner keeps the Python step. Only the oneDNN and panel products (float32 and bfloat16 on a CPU) are scripted.

The functions here are also plain Python: `packed_linear` is what `PackedLinear` calls outside the scripted step,
and `attend_rows` what the Python step attends with, so each is written once.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Callable
from typing import Any, List, Optional, Tuple, Union  # noqa: UP035 - TorchScript reads typing's names

import torch

from .decode_kernels import register_operator

log = logging.getLogger(__name__)

# How a product treats its input and output (`PackedLinear.mode`): float32; bfloat16 weights packed for the CPU's
# bfloat16 kernel; bfloat16-rounded weights in the float32 kernel (CPUs without bfloat16 kernels, see linear.py);
# float32 weights packed in panels for the compiled `agl::panel_product` (decode_ops.cpp), where it is built.
FLOAT32, BF16_NATIVE, BF16_EMULATED, FLOAT32_PANELS = 0, 1, 2, 3


def _rows_product(
    x: torch.Tensor, weight: torch.Tensor, no_scalars: List[Optional[Union[int, float, complex]]],  # noqa: UP006,UP007,UP045
) -> torch.Tensor:
    if x.shape[0] == 1:
        # oneDNN computes a lone row with another kernel (different float32 rounding); as a pair it is computed
        # exactly as inside any larger batch.
        return torch.ops.mkldnn._linear_pointwise(x.expand(2, -1), weight, None, "none", no_scalars, "")[:1]
    return torch.ops.mkldnn._linear_pointwise(x, weight, None, "none", no_scalars, "")


def packed_product(x: torch.Tensor, weight: torch.Tensor, mode: int) -> torch.Tensor:
    """x @ W.T with `x` already as the product takes it (`product_input`): bfloat16 out for BF16_NATIVE, float32
    rounded to bfloat16 and stored as bfloat16 for BF16_EMULATED, float32 for FLOAT32 and FLOAT32_PANELS."""
    if mode == 3:  # FLOAT32_PANELS: every row in the same order whatever the batch, one row included
        return torch.ops.agl.panel_product(x, weight)
    no_scalars = torch.jit.annotate(List[Optional[Union[int, float, complex]]], [])  # noqa: UP006,UP007,UP045 - aten's Scalar?[]
    if mode == 1 and x.shape[0] > 32:  # BF16_NATIVE; a literal: TorchScript reads no module-level ints
        # Past 32 rows oneDNN's bfloat16 products switch kernels on CPUs with AMX tiles (Sapphire Rapids and later),
        # which round a row differently from the same row in a smaller batch: products of at most 32 rows keep every
        # row's bits whatever the batch holds.
        chunks = [_rows_product(part, weight, no_scalars) for part in x.split(32)]
        y = torch.cat(chunks)
    else:
        y = _rows_product(x, weight, no_scalars)
    if mode == 2:  # BF16_EMULATED
        y = y.to(torch.bfloat16)
    return y


def product_input(x: torch.Tensor, mode: int) -> torch.Tensor:
    """float32 `x` as a product of `mode` takes it."""
    if mode == 1:  # BF16_NATIVE (TorchScript reads no module constants)
        return x.to(torch.bfloat16)
    if mode == 2:  # BF16_EMULATED
        return x.to(torch.bfloat16).float()
    return x


def packed_linear(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor], mode: int) -> torch.Tensor:  # noqa: UP045
    """x @ W.T (+ b) with a weight packed by `torch.ops.mkldnn._reorder_linear_weight` (or in panels, mode
    FLOAT32_PANELS); float32 in and out."""
    y = packed_product(product_input(x, mode), weight, mode).float()
    if bias is not None:
        y = y + bias
    return y


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embeddings as Hugging Face's Llama applies them (rotate_half)."""
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


def attention_inputs(
    x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, norm: torch.Tensor, weight: torch.Tensor,
    bias: Optional[torch.Tensor], mode: int, heads: int, kv_heads: int, head_dim: int, eps: float,  # noqa: UP045
) -> Tuple[torch.Tensor, torch.Tensor]:  # noqa: UP006
    """A layer's queries [rows, heads, head_dim], scaled by 1/sqrt(head_dim), and its new keys and values
    [rows, 2, kv_heads, head_dim], rotary embeddings applied."""
    rows = x.shape[0]
    qkv = packed_linear(torch.rms_norm(x, [x.shape[-1]], norm, eps), weight, bias, mode).view(rows, -1, head_dim)
    rotated = rotate(qkv[:, : heads + kv_heads], cos, sin)
    kv = torch.stack((rotated[:, heads:], qkv[:, heads + kv_heads :]), dim=1)
    return rotated[:, :heads] * (float(head_dim) ** -0.5), kv


def attend_rows(
    q: torch.Tensor, kv: torch.Tensor, kvs: List[torch.Tensor], positions: List[int], layer: int, kv_heads: int,  # noqa: UP006
) -> torch.Tensor:
    """Row by row: store each row's new key and value in its cache [layers, 2, kv_heads, capacity, head_dim] at
    `positions[row]`, and attend its queries over its own keys. The rows [rows, heads * head_dim].

    What the compiled kernel (decode_kernels.py) does where it builds; one product per row keeps each row's
    result independent of the batch."""
    rows, heads, head_dim = q.shape[0], q.shape[1], q.shape[2]
    grouped = q.view(rows, kv_heads, heads // kv_heads, head_dim)  # the query heads sharing a key head as its rows
    outs: List[torch.Tensor] = []  # noqa: UP006
    for row in range(rows):
        n = positions[row]
        cache = kvs[row][layer]
        cache[:, :, n] = kv[row]
        attn = torch.softmax(torch.matmul(grouped[row], cache[0, :, : n + 1].transpose(1, 2)), dim=-1)
        outs.append(torch.matmul(attn, cache[1, :, : n + 1]).view(1, -1))
    return torch.cat(outs) if rows > 1 else outs[0]


def attend_step(
    q: torch.Tensor, kv: torch.Tensor, kvs: List[torch.Tensor], positions: List[int], layer: int, kv_heads: int,  # noqa: UP006
    kernel: Optional[List[torch.Tensor]], kernel_rows: List[int],  # noqa: UP006,UP045
) -> torch.Tensor:
    """A decode step's attention for one layer: the rows in `kernel_rows` by the compiled kernel (the operator
    `agl::decode_attention`, with `kernel` its `KernelStep.tensors`), the others row by row in torch."""
    rows = q.shape[0]
    if kernel is None:
        return attend_rows(q, kv, kvs, positions, layer, kv_heads)
    if len(kernel_rows) == rows:
        return torch.ops.agl.decode_attention(q, kv, kernel[0], kernel[1], kernel[2], layer, kv_heads)
    out = torch.empty(rows, q.shape[1] * q.shape[2], dtype=q.dtype)
    chosen = torch.tensor(kernel_rows, dtype=torch.long)
    out[chosen] = torch.ops.agl.decode_attention(q[chosen], kv[chosen], kernel[0], kernel[1], kernel[2], layer,
                                                 kv_heads)
    others: List[int] = []  # noqa: UP006
    for row in range(rows):
        if row not in kernel_rows:
            others.append(row)
    rest = torch.tensor(others, dtype=torch.long)
    out[rest] = attend_rows(q[rest], kv[rest], [kvs[r] for r in others], [positions[r] for r in others], layer,
                            kv_heads)
    return out


def finish_layer(
    x: torch.Tensor, attention: torch.Tensor, norm: torch.Tensor, weights: List[torch.Tensor],  # noqa: UP006
    biases: List[Optional[torch.Tensor]], modes: List[int], eps: float,  # noqa: UP006,UP045
) -> torch.Tensor:
    """The rest of a layer after attention: output product and residual, norm, gate/up, SiLU, down and residual.
    `weights`/`biases`/`modes` hold the output, gate/up and down products."""
    x = x + packed_linear(attention, weights[0], biases[0], modes[0])
    normed = torch.rms_norm(x, [x.shape[-1]], norm, eps)
    gate, up = packed_linear(normed, weights[1], biases[1], modes[1]).chunk(2, dim=-1)
    return x + packed_linear(torch.nn.functional.silu(gate) * up, weights[2], biases[2], modes[2])


def final_logits(
    x: torch.Tensor, norm: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor], mode: int, eps: float,  # noqa: UP045
) -> torch.Tensor:
    return packed_linear(torch.rms_norm(x, [x.shape[-1]], norm, eps), weight, bias, mode)


def fused_layers(
    x: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    kvs: List[torch.Tensor],  # noqa: UP006
    positions: List[int],  # noqa: UP006
    norms: List[torch.Tensor],  # noqa: UP006
    weights: List[torch.Tensor],  # noqa: UP006
    modes: List[int],  # noqa: UP006
    heads: int,
    kv_heads: int,
    head_dim: int,
    eps: float,
    kernel: Optional[List[torch.Tensor]],  # noqa: UP006,UP045
    kernel_rows: List[int],  # noqa: UP006
) -> torch.Tensor:
    """`decode_layers` with the operations between the products fused (the compiled operators `agl::add_rms_norm`,
    `agl::rotary` and `agl::silu_mul`, decode_kernels.py): each product's output goes straight to the next
    operator in the product's own dtype, and what feeds the next product comes out in that product's. For models
    without biases, where the native operators are registered. Each operator computes a row by itself, so rows stay
    batch invariant; the numbers differ from the unfused step's by float32 rounding."""
    rows = x.shape[0]
    cos, sin = cos.reshape(rows, head_dim), sin.reshape(rows, head_dim)
    scale = float(head_dim) ** -0.5
    delta = torch.empty(0, 0)  # the first layer adds nothing to its input
    for index in range(len(norms) // 2):
        p = 4 * index
        x, normed = torch.ops.agl.add_rms_norm(x, delta, norms[2 * index], eps, modes[p])
        q, kv = torch.ops.agl.rotary(packed_product(normed, weights[p], modes[p]), cos, sin, heads, kv_heads, scale)
        attention = attend_step(q.view(rows, heads, head_dim), kv.view(rows, 2, kv_heads, head_dim), kvs, positions,
                                index, kv_heads, kernel, kernel_rows)
        out = packed_product(product_input(attention, modes[p + 1]), weights[p + 1], modes[p + 1])
        x, normed = torch.ops.agl.add_rms_norm(x, out, norms[2 * index + 1], eps, modes[p + 2])
        gate_up = packed_product(normed, weights[p + 2], modes[p + 2])
        delta = packed_product(torch.ops.agl.silu_mul(gate_up, modes[p + 3]), weights[p + 3], modes[p + 3])
    x, normed = torch.ops.agl.add_rms_norm(x, delta, norms[-1], eps, modes[-1])
    return packed_product(normed, weights[-1], modes[-1]).float()


def decode_layers(
    x: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    kvs: List[torch.Tensor],  # noqa: UP006
    positions: List[int],  # noqa: UP006
    norms: List[torch.Tensor],  # noqa: UP006
    weights: List[torch.Tensor],  # noqa: UP006
    biases: List[Optional[torch.Tensor]],  # noqa: UP006,UP045
    modes: List[int],  # noqa: UP006
    heads: int,
    kv_heads: int,
    head_dim: int,
    eps: float,
    kernel: Optional[List[torch.Tensor]],  # noqa: UP006,UP045
    kernel_rows: List[int],  # noqa: UP006
    fused: bool,
) -> torch.Tensor:
    """Every layer of one decode step and the final norm and vocabulary head: the logits, one row per sequence.

    Per layer, `norms` holds two vectors (before attention, before the MLP) and `weights`/`biases`/`modes` four
    products (q/k/v, output, gate/up, down); the last norm and product are the model's final norm and head. `kvs`
    holds each row's cache [layers, 2, kv_heads, capacity, head_dim]; row r's new position is `positions[r]`.
    `kernel` and `kernel_rows` say which rows the compiled attention attends (`attend_step`); `fused` runs
    `fused_layers` instead. The same operations as `LlamaRunner`'s Python step, in the same order."""
    if fused:
        return fused_layers(x, cos, sin, kvs, positions, norms, weights, modes, heads, kv_heads, head_dim, eps, kernel,
                            kernel_rows)
    for index in range(len(norms) // 2):
        p = 4 * index
        q, kv = attention_inputs(x, cos, sin, norms[2 * index], weights[p], biases[p], modes[p], heads, kv_heads,
                                 head_dim, eps)
        attention = attend_step(q, kv, kvs, positions, index, kv_heads, kernel, kernel_rows)
        x = finish_layer(x, attention, norms[2 * index + 1], weights[p + 1 : p + 4], biases[p + 1 : p + 4],
                         modes[p + 1 : p + 4], eps)
    return final_logits(x, norms[-1], weights[-1], biases[-1], modes[-1], eps)


def compile_decode() -> Callable[..., torch.Tensor] | None:
    """`decode_layers` scripted, or None (with the reason logged) where TorchScript cannot compile it."""
    if torch._C._jit_can_fuse_on_cpu():
        # A fuser allowed on the CPU would merge elementwise ops into kernels of its own, with other rounding.
        log.info("a TorchScript fuser is enabled on the CPU: decode steps stay in Python")
        return None
    try:
        register_operator()  # the compiled attention's operator must exist for the script to name it
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # see the module docstring
            return torch.jit.script(decode_layers)
    except Exception as exc:  # noqa: BLE001 - any compile failure means the Python step, which computes the same
        log.info("TorchScript cannot compile the decode step (%s): decode steps stay in Python", exc)
        return None


def flatten(layers: list[Any], final_norm: torch.Tensor, head: Any) -> tuple[list[torch.Tensor], list[torch.Tensor],
                                                                            list[torch.Tensor | None], list[int]]:
    """The packed model as `decode_layers` takes it: norms, weights, biases and modes, layer by layer, then the head."""
    norms: list[torch.Tensor] = []
    products: list[Any] = []
    for layer in layers:
        norms += [layer.norm1, layer.norm2]
        products += [layer.qkv, layer.out, layer.gate_up, layer.down]
    norms.append(final_norm)
    products.append(head)
    return norms, [p.packed for p in products], [p.bias for p in products], [p.mode for p in products]
