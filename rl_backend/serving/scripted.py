"""The fast runner's decode step compiled by TorchScript: the same kernels, called from C++ instead of Python.

At 8 sequences a decode step of a 30-layer model makes about 2,000 small torch calls (per-row attention, norms,
rotary embeddings, residuals). From Python each call pays the interpreter's dispatch and a GIL hand-over, and the
server's event loop, which streams the tokens on another thread, takes the GIL between them. Scripted, the step
runs in TorchScript's interpreter with the GIL released (whole, or layer by layer around the compiled attention of
attention_kernel.py, which TorchScript cannot call): the same aten operations in the same order
(TorchScript fuses nothing on a CPU unless told to, and `compile_decode` declines when it was), so every row's token
ids and logprobs are bit for bit those of the Python step, alone or batched (tests/test_engine.py checks both).

`torch.jit.script` is deprecated in favour of `torch.compile`, which cannot lower the packed oneDNN weights (its
linear lowering asserts they are graph constants; see the README's serving notes). Where scripting fails, the
runner keeps the Python step. Only the oneDNN products (float32 and bfloat16 on a CPU) are scripted.

The functions here are also plain Python: `onednn_linear` is what `PackedLinear` calls outside the scripted step,
and `attend_rows` what the Python step attends with, so each is written once.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Callable
from typing import Any, List, Optional, Tuple, Union  # noqa: UP035 - TorchScript reads typing's names

import torch

log = logging.getLogger(__name__)

# How a product treats its input and output (`PackedLinear.mode`): float32; bfloat16 weights packed for the CPU's
# bfloat16 kernel; bfloat16-rounded weights in the float32 kernel (CPUs without bfloat16 kernels, see linear.py).
FLOAT32, BF16_NATIVE, BF16_EMULATED = 0, 1, 2


def onednn_linear(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor], mode: int) -> torch.Tensor:  # noqa: UP045
    """x @ W.T (+ b) with a weight packed by `torch.ops.mkldnn._reorder_linear_weight`; float32 in and out."""
    no_scalars = torch.jit.annotate(List[Optional[Union[int, float, complex]]], [])  # noqa: UP006,UP007,UP045 - aten's Scalar?[]
    if mode == 1:  # BF16_NATIVE (TorchScript reads no module constants)
        x = x.to(torch.bfloat16)
    elif mode == 2:  # BF16_EMULATED
        x = x.to(torch.bfloat16).float()
    if x.shape[0] == 1:
        # oneDNN computes a lone row with another kernel (different float32 rounding); as a pair it is computed
        # exactly as inside any larger batch.
        y = torch.ops.mkldnn._linear_pointwise(x.expand(2, -1), weight, None, "none", no_scalars, "")[:1]
    else:
        y = torch.ops.mkldnn._linear_pointwise(x, weight, None, "none", no_scalars, "")
    if mode == 2:  # BF16_EMULATED
        y = y.to(torch.bfloat16)
    y = y.float()
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
    qkv = onednn_linear(torch.rms_norm(x, [x.shape[-1]], norm, eps), weight, bias, mode).view(rows, -1, head_dim)
    rotated = rotate(qkv[:, : heads + kv_heads], cos, sin)
    kv = torch.stack((rotated[:, heads:], qkv[:, heads + kv_heads :]), dim=1)
    return rotated[:, :heads] * (float(head_dim) ** -0.5), kv


def attend_rows(
    q: torch.Tensor, kv: torch.Tensor, kvs: List[torch.Tensor], positions: List[int], layer: int, kv_heads: int,  # noqa: UP006
) -> torch.Tensor:
    """Row by row: store each row's new key and value in its cache [layers, 2, kv_heads, capacity, head_dim] at
    `positions[row]`, and attend its queries over its own keys. The rows [rows, heads * head_dim].

    What the compiled kernel (attention_kernel.py) does where it builds; one product per row keeps each row's
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


def finish_layer(
    x: torch.Tensor, attention: torch.Tensor, norm: torch.Tensor, weights: List[torch.Tensor],  # noqa: UP006
    biases: List[Optional[torch.Tensor]], modes: List[int], eps: float,  # noqa: UP006,UP045
) -> torch.Tensor:
    """The rest of a layer after attention: output product and residual, norm, gate/up, SiLU, down and residual.
    `weights`/`biases`/`modes` hold the output, gate/up and down products."""
    x = x + onednn_linear(attention, weights[0], biases[0], modes[0])
    normed = torch.rms_norm(x, [x.shape[-1]], norm, eps)
    gate, up = onednn_linear(normed, weights[1], biases[1], modes[1]).chunk(2, dim=-1)
    return x + onednn_linear(torch.nn.functional.silu(gate) * up, weights[2], biases[2], modes[2])


def final_logits(
    x: torch.Tensor, norm: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor], mode: int, eps: float,  # noqa: UP045
) -> torch.Tensor:
    return onednn_linear(torch.rms_norm(x, [x.shape[-1]], norm, eps), weight, bias, mode)


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
) -> torch.Tensor:
    """Every layer of one decode step, attending row by row, and the final norm and vocabulary head: the logits,
    one row per sequence (where the attention kernel is not built; `DecodePieces.step` is the same with it).

    Per layer, `norms` holds two vectors (before attention, before the MLP) and `weights`/`biases`/`modes` four
    products (q/k/v, output, gate/up, down); the last norm and product are the model's final norm and head. `kvs`
    holds each row's cache [layers, 2, kv_heads, capacity, head_dim]; row r's new position is `positions[r]`.
    The same operations as `LlamaRunner`'s Python step, in the same order."""
    for index in range(len(norms) // 2):
        p = 4 * index
        q, kv = attention_inputs(x, cos, sin, norms[2 * index], weights[p], biases[p], modes[p], heads, kv_heads,
                                 head_dim, eps)
        attention = attend_rows(q, kv, kvs, positions, index, kv_heads)
        x = finish_layer(x, attention, norms[2 * index + 1], weights[p + 1 : p + 4], biases[p + 1 : p + 4],
                         modes[p + 1 : p + 4], eps)
    return final_logits(x, norms[-1], weights[-1], biases[-1], modes[-1], eps)


class DecodeStep:
    """The scripted decode step: whole, attending row by row (`decode_layers`), or layer by layer around a
    compiled attention (attention_kernel.py), which TorchScript cannot call. Same numbers as the Python step."""

    def __init__(self) -> None:
        self.whole = torch.jit.script(decode_layers)
        self.inputs = torch.jit.script(attention_inputs)
        self.finish = torch.jit.script(finish_layer)
        self.logits = torch.jit.script(final_logits)

    def __call__(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, kvs: list[torch.Tensor], positions: list[int],
        flat: tuple[list[Any], ...], heads: int, kv_heads: int, head_dim: int, eps: float,
        attend: Callable[[int, torch.Tensor, torch.Tensor], torch.Tensor] | None,
    ) -> torch.Tensor:
        norms, weights, biases, modes = flat
        if attend is None:
            return self.whole(x, cos, sin, kvs, positions, norms, weights, biases, modes, heads, kv_heads, head_dim, eps)
        for index in range(len(norms) // 2):
            p = 4 * index
            q, kv = self.inputs(x, cos, sin, norms[2 * index], weights[p], biases[p], modes[p], heads, kv_heads,
                                head_dim, eps)
            x = self.finish(x, attend(index, q, kv), norms[2 * index + 1], weights[p + 1 : p + 4],
                            biases[p + 1 : p + 4], modes[p + 1 : p + 4], eps)
        return self.logits(x, norms[-1], weights[-1], biases[-1], modes[-1], eps)


def compile_decode() -> DecodeStep | None:
    """The decode step scripted, or None (with the reason logged) where TorchScript cannot compile it."""
    if torch._C._jit_can_fuse_on_cpu():
        # A fuser allowed on the CPU would merge elementwise ops into kernels of its own, with other rounding.
        log.info("a TorchScript fuser is enabled on the CPU: decode steps stay in Python")
        return None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # see the module docstring
            return DecodeStep()
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
