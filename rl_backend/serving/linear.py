"""Matrix products for the fast runner, in one of three precisions, with weights packed once for the CPU's kernel.

- `float32` (the default on CPU): where the compiled kernels were built with C++ (decode_kernels.py), the weight
  packed in panels for `agl::panel_product`: every output one chain of multiply-adds in a fixed order, so a row's
  result cannot depend on its batch, and at a decode step's few rows it reads the weights about 1.4 times as fast
  as oneDNN. Otherwise oneDNN's linear with its weight reordered ahead of time: on the x86 CPUs tested about twice
  as fast as the default BLAS path at 8 rows, and a row's result does not depend on how many other rows share the
  product or on the thread count (bit for bit; a single row goes through a different kernel, so one row is computed
  as two). That is what makes the engine batch invariant.
- `bfloat16`: the same with weights and inputs rounded to bfloat16 (fp32 accumulation, fp32 everywhere else). Also
  batch invariant and about twice as fast again, but its logprobs differ from the float32 model the trainer
  trains (by about 1e-2), so it is meant for evaluation, not for serving a training run. oneDNN's bfloat16
  products need AVX512 (bw/vl/dq) or AVX-NE-CONVERT; on a CPU without them (AVX2-only EPYCs and older Xeons) the
  weights are rounded to bfloat16 once and multiplied by the float32 kernel, inputs and outputs rounded to bfloat16
  as the native path rounds them: bfloat16's numbers and batch invariance, at float32's speed (`bf16_native`).
- `int8-dynamic`: torch's dynamic int8 quantization (activations quantized per tensor on the fly). Its rows depend on
  each other (one outlier row changes every row's scale), so it breaks batch invariance; it exists so that the
  serving benchmark can measure it, and neither `agl serve` nor agl.yaml offer it.

Where oneDNN is unavailable (another device, a torch built without it) products fall back to `F.linear`.
"""

from __future__ import annotations

import functools
import logging
import warnings
from typing import Any, Literal

import torch
import torch.nn.functional as F

from .decode_kernels import pack_panels
from .scripted import BF16_EMULATED, BF16_NATIVE, FLOAT32, FLOAT32_PANELS, packed_linear

Precision = Literal["float32", "bfloat16", "int8-dynamic"]
PRECISIONS: tuple[Precision, ...] = ("float32", "bfloat16", "int8-dynamic")
SERVABLE: tuple[Precision, ...] = ("float32", "bfloat16")

log = logging.getLogger(__name__)


def onednn_available(device: torch.device) -> bool:
    return device.type == "cpu" and torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")


@functools.cache
def bf16_native() -> bool:
    """Whether oneDNN packs bfloat16 weights on this CPU (it refuses without AVX512 bw/vl/dq or AVX-NE-CONVERT)."""
    try:
        torch.ops.mkldnn._reorder_linear_weight(torch.zeros(2, 2, dtype=torch.bfloat16))
    except RuntimeError as exc:
        log.warning(
            "this CPU has no bfloat16 matrix kernels (%s): bfloat16 is computed with bfloat16-rounded weights in "
            "float32 kernels, the same numbers at float32's speed", str(exc).split(":")[-1].strip(),
        )
        return False
    return True


class PackedLinear:
    """y = x @ W.T (+ b) for a fixed W; `x` and `y` are float32 whatever the precision.

    On oneDNN or in panels, `packed`, `bias` and `mode` are what `scripted.packed_linear` computes with (`mode` is
    None elsewhere), so the scripted decode step runs the same product."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, precision: Precision,
                 panel_width: int = 0) -> None:
        """`panel_width`: pack float32 weights in panels of that many outputs for the compiled panel product
        (where it is built; 0 keeps oneDNN's)."""
        self.precision = precision
        self.out_features = int(weight.shape[0])
        self.bias = None if bias is None else bias.detach().float().contiguous()
        self.mode: int | None = None
        w = weight.detach()
        self.packed: Any
        if precision == "int8-dynamic":
            self.packed = _int8_pack(w.float(), self.bias)
        elif precision == "float32" and panel_width and weight.device.type == "cpu" and self.out_features % panel_width == 0:
            self.mode, self.packed = FLOAT32_PANELS, pack_panels(w, panel_width)
        elif onednn_available(weight.device):
            if precision == "float32":
                self.mode, w = FLOAT32, w.float()
            elif bf16_native():
                self.mode, w = BF16_NATIVE, w.to(torch.bfloat16)
            else:  # no bfloat16 kernels on this CPU: bfloat16 values through the float32 kernel
                self.mode, w = BF16_EMULATED, w.to(torch.bfloat16).float()
            self.packed = torch.ops.mkldnn._reorder_linear_weight(w.contiguous())
        else:
            self.packed = w.to(torch.bfloat16 if precision == "bfloat16" else torch.float32).contiguous()

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.precision == "int8-dynamic":
            return torch.ops.quantized.linear_dynamic(x, self.packed)
        if self.mode is not None:
            return packed_linear(x, self.packed, self.bias, self.mode)
        y = F.linear(x.to(self.packed.dtype), self.packed).float()
        return y if self.bias is None else y + self.bias


def _int8_pack(weight: torch.Tensor, bias: torch.Tensor | None) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch's quantized tensors are deprecated; this path is measured, not served
        scale = weight.abs().amax(dim=1).clamp(min=1e-8) / 127.0
        q = torch.quantize_per_channel(weight, scale, torch.zeros_like(scale, dtype=torch.long), 0, torch.qint8)
        return torch.ops.quantized.linear_prepack(q, bias)
