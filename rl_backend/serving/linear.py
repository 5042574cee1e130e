"""Matrix products for the fast runner, in one of three precisions, with weights packed once for the CPU's kernel.

- `float32` (the default on CPU): oneDNN's linear with its weight reordered ahead of time. On the x86 CPUs tested
  it is about twice as fast as the default BLAS path at 8 rows, and a row's result does not depend on how many
  other rows share the product or on the thread count (bit for bit; a single row goes through a different kernel,
  so one row is computed as two). That is what makes the engine batch invariant.
- `bfloat16`: the same with weights and inputs rounded to bfloat16 (fp32 accumulation, fp32 everywhere else). Also
  batch invariant and about twice as fast again, but its logprobs differ from the float32 model the trainer
  trains (by about 1e-2), so it is meant for evaluation, not for serving a training run.
- `int8-dynamic`: torch's dynamic int8 quantization (activations quantized per tensor on the fly). Its rows depend on
  each other (one outlier row changes every row's scale), so it breaks batch invariance; it exists so that the
  serving benchmark can measure it, and neither `agl serve` nor agl.yaml offer it.

Where oneDNN is unavailable (another device, a torch built without it) products fall back to `F.linear`.
"""

from __future__ import annotations

import warnings
from typing import Any, Literal

import torch
import torch.nn.functional as F

Precision = Literal["float32", "bfloat16", "int8-dynamic"]
PRECISIONS: tuple[Precision, ...] = ("float32", "bfloat16", "int8-dynamic")
SERVABLE: tuple[Precision, ...] = ("float32", "bfloat16")


def onednn_available(device: torch.device) -> bool:
    return device.type == "cpu" and torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")


class PackedLinear:
    """y = x @ W.T (+ b) for a fixed W; `x` and `y` are float32 whatever the precision."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, precision: Precision) -> None:
        self.precision = precision
        self.out_features = int(weight.shape[0])
        self._bias = None if bias is None else bias.detach().float().contiguous()
        self._onednn = precision in ("float32", "bfloat16") and onednn_available(weight.device)
        w = weight.detach()
        self._packed: Any
        if precision == "int8-dynamic":
            self._packed = _int8_pack(w.float(), self._bias)
        elif self._onednn:
            dtype = torch.bfloat16 if precision == "bfloat16" else torch.float32
            self._packed = torch.ops.mkldnn._reorder_linear_weight(w.to(dtype).contiguous())
        else:
            self._packed = w.to(torch.bfloat16 if precision == "bfloat16" else torch.float32).contiguous()

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.precision == "int8-dynamic":
            return torch.ops.quantized.linear_dynamic(x, self._packed)
        if self.precision == "bfloat16":
            x = x.to(torch.bfloat16)
        if not self._onednn:
            y = F.linear(x, self._packed)
        elif x.shape[0] == 1:
            # oneDNN computes a lone row with another kernel (different float32 rounding); as a pair it is computed
            # exactly as inside any larger batch.
            y = torch.ops.mkldnn._linear_pointwise(x.expand(2, -1), self._packed, None, "none", [], "")[:1]
        else:
            y = torch.ops.mkldnn._linear_pointwise(x, self._packed, None, "none", [], "")
        y = y.float()
        return y if self._bias is None else y + self._bias


def _int8_pack(weight: torch.Tensor, bias: torch.Tensor | None) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch's quantized tensors are deprecated; this path is measured, not served
        scale = weight.abs().amax(dim=1).clamp(min=1e-8) / 127.0
        q = torch.quantize_per_channel(weight, scale, torch.zeros_like(scale, dtype=torch.long), 0, torch.qint8)
        return torch.ops.quantized.linear_prepack(q, bias)
