"""The fast runner: a lean forward pass for Llama-family models (Llama, SmolLM2, Mistral, Qwen2) on the CPU.

It reads the weights of the loaded Hugging Face model and computes the same function with less work per step:
- the matrix products use weights packed once (`linear.py`; q/k/v fused into one product, gate/up into another);
- prefill is batched: the new tokens of every admitted prompt go through each product as one matrix, and attention
  runs per prompt over its own keys, so nothing is padded;
- each sequence keeps its keys and values in its own buffer (`prefix_cache.py`), so decode appends in place,
  attention reads exactly a row's own positions, and a finished sequence's cache serves the next prompt that starts
  the same way (an agent's next turn) without recomputing it;
- a decode step's attention runs as one small compiled function per layer (`decode_kernels.py`), every row
  over its own keys, where the system has a C or C++ compiler (built as C, rows of up to `KERNEL_LONGEST` keys;
  longer ones attend row by row in torch);
- with a C++ compiler, float32 products read weights packed in panels (`agl::panel_product`), and the operations
  between a decode step's products are one compiled operator each (`scripted.fused_layers`);
- a decode step runs in TorchScript where the products are oneDNN's or the panels' (`scripted.py`): the same
  operations without Python's dispatch per operation, and with the GIL free for the server's event loop meanwhile.

Batch invariance: a row's products do not depend on the other rows (see `linear.py`), normalisation and rotary
embeddings are per row, and attention is computed per row over its own length, so a request's token ids and logprobs
come out the same, bit for bit on the CPUs tested, whether it runs alone or with others.

Models it cannot run exactly (other architectures, sliding windows, dynamic rotary scaling) are reported by
`unsupported_reason`, and the engine serves them through the Hugging Face forward instead.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from .decode_kernels import DecodeKernels, KernelStep
from .decode_kernels import load as load_decode_kernels
from .linear import PackedLinear, Precision
from .prefix_cache import PrefixCache, SeqKV
from .scripted import attend_step, compile_decode, flatten, fused_layers, rotate

_FAMILIES = {"llama", "mistral", "qwen2"}
# Rows with more keys than this attend in torch, whose products spread a row over every thread, rather than in the
# kernel built as C, which runs on one thread: past a few hundred keys reading them is what costs, and one core
# reads them slower than two (README, Benchmarks). Each row's own length decides, so a row's result never depends on
# its batch. The native operator (built as C++) shares the rows among the threads and is the faster at any length:
# NATIVE_KERNEL_LONGEST, None for no limit.
KERNEL_LONGEST = 192
NATIVE_KERNEL_LONGEST: int | None = None
_ROPE_TYPES = {"default", "linear", "llama3"}


def unsupported_reason(model: Any) -> str | None:
    """Why the fast runner cannot serve `model` exactly, or None when it can."""
    config = model.config
    if getattr(config, "model_type", None) not in _FAMILIES:
        return f"model type {getattr(config, 'model_type', None)!r} is not one of {sorted(_FAMILIES)}"
    if getattr(config, "hidden_act", "silu") != "silu":
        return f"activation {config.hidden_act!r} is not silu"
    if getattr(config, "sliding_window", None) and getattr(config, "use_sliding_window", True):
        return "sliding-window attention"
    rope = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    rope_type = rope.get("rope_type", rope.get("type", "default")) if isinstance(rope, dict) else "default"
    if rope_type not in _ROPE_TYPES:
        return f"rotary scaling {rope_type!r}"
    inner = getattr(model, "model", None)
    if inner is None or not hasattr(inner, "layers") or not hasattr(inner, "rotary_emb"):
        return "the model does not have the Llama module layout"
    if next(model.parameters()).device.type != "cpu":
        return "the model is not on the CPU"
    return None


@dataclass
class _Layer:
    norm1: torch.Tensor
    qkv: PackedLinear
    out: PackedLinear
    norm2: torch.Tensor
    gate_up: PackedLinear
    down: PackedLinear


class LlamaRunner:
    """Prefill and decode for a Llama-family model; sequences are `SeqKV`s (see the module docstring)."""

    def __init__(
        self, model: Any, *, precision: Precision = "float32", prefix_cache_bytes: int = 1 << 30, scripted: bool = True,
        attention_kernel: bool = True,
    ) -> None:
        """`scripted=False` keeps decode steps in Python (the serving profile times their parts that way);
        `attention_kernel=False` attends row by row in torch instead of with the compiled kernel."""
        reason = unsupported_reason(model)
        if reason is not None:
            raise ValueError(f"the fast runner cannot serve this model: {reason}")
        self.model = model
        self.precision: Precision = precision
        config = model.config
        self.heads = int(config.num_attention_heads)
        self.kv_heads = int(getattr(config, "num_key_value_heads", None) or self.heads)
        self.head_dim = int(getattr(config, "head_dim", None) or config.hidden_size // self.heads)
        self.layers_n = int(config.num_hidden_layers)
        self.eps = float(config.rms_norm_eps)
        self.cache = PrefixCache(prefix_cache_bytes)
        self.counters = {"prefill_tokens": 0, "reused_tokens": 0}
        # Packed on first use, or by refresh(), on the thread that computes: packing runs torch's OpenMP threads,
        # which live as long as the thread that started them, and a second set beside the engine's makes libgomp
        # count more threads than cores and throttle both (two-thread decode steps ran 2.3 times slower).
        self._layers: list[_Layer] | None = None
        self.scripted = scripted
        self.attention_kernel = attention_kernel
        self._scripted_step: Any = None  # compiled on first use, where possible
        self._flat: tuple[list[Any], ...] = ()
        self._packed_only = False  # every product oneDNN's or the panels', which the scripted step needs (refresh)
        self._fusable = False  # and without biases, at sizes the fused operators take (scripted.fused_layers)

    def refresh(self) -> None:
        """Pack the model's current weights (after new weights were loaded) and forget every cached sequence."""
        inner = self.model.model
        self._embed = inner.embed_tokens.weight.detach().float()
        kernel = self._attention_kernel()
        # float32 products in panels where the compiled panel product is built (faster at decode batches, and
        # batch invariant by construction); oneDNN's otherwise.
        width = kernel.panel_width if kernel is not None and self.precision == "float32" else 0
        self._layers = [
            _Layer(
                norm1=layer.input_layernorm.weight.detach().float(),
                qkv=_fused(self.precision, width, layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj),
                out=_fused(self.precision, width, layer.self_attn.o_proj),
                norm2=layer.post_attention_layernorm.weight.detach().float(),
                gate_up=_fused(self.precision, width, layer.mlp.gate_proj, layer.mlp.up_proj),
                down=_fused(self.precision, width, layer.mlp.down_proj),
            )
            for layer in inner.layers
        ]
        self._norm = inner.norm.weight.detach().float()
        self._head = _fused(self.precision, width, self.model.lm_head)
        rotary = inner.rotary_emb
        positions = torch.arange(int(self.model.config.max_position_embeddings), dtype=torch.float32)
        # The same products as the Hugging Face rotary module computes, tabulated once.
        freqs = positions[:, None] * rotary.inv_freq.float()[None, :]
        angles = torch.cat((freqs, freqs), dim=-1)
        scale = float(getattr(rotary, "attention_scaling", 1.0))
        self._cos, self._sin = angles.cos() * scale, angles.sin() * scale
        self._flat = flatten(self._layers, self._norm, self._head)
        self._packed_only = all(mode is not None for mode in self._flat[3])
        hidden, inner_size = int(self._norm.shape[0]), self._layers[0].gate_up.out_features // 2 if self._layers else 0
        self._fusable = (self._packed_only and all(bias is None for bias in self._flat[2]) and hidden % 8 == 0
                         and inner_size % 8 == 0 and self.head_dim % 2 == 0)
        self.cache.clear()

    # ---- sequences ---------------------------------------------------------------------------------------------

    def _new_seq(self, capacity: int) -> SeqKV:
        return SeqKV.empty((self.layers_n, self.kv_heads, self.head_dim), capacity, torch.float32, self._embed.device)

    def release(self, seqs: list[SeqKV]) -> None:
        """Sequences that are done: their caches go to the prefix cache."""
        for seq in seqs:
            self.cache.put(seq)

    def clear(self) -> None:
        self.cache.clear()

    # ---- forward -----------------------------------------------------------------------------------------------

    def _packed(self) -> list[_Layer]:
        if self._layers is None:
            self.refresh()
        assert self._layers is not None
        return self._layers

    def prefill(self, prompts: list[list[int]]) -> tuple[list[SeqKV], torch.Tensor]:
        """Start a sequence per prompt (reusing cached prefixes); the logits of each prompt's last position."""
        layers = self._packed()
        seqs = [self.cache.take(p, self._new_seq(len(p) + 64)) for p in prompts]
        spans: list[tuple[SeqKV, int, int]] = []  # (sequence, first new position, new tokens)
        ids: list[int] = []
        positions: list[int] = []
        for seq, prompt in zip(seqs, prompts, strict=True):
            start = seq.length
            seq.reserve(len(prompt) + 1)
            spans.append((seq, start, len(prompt) - start))
            ids += prompt[start:]
            positions += range(start, len(prompt))
            self.counters["reused_tokens"] += start
        self.counters["prefill_tokens"] += len(ids)
        pos = torch.tensor(positions, dtype=torch.long)
        x = F.embedding(torch.tensor(ids, dtype=torch.long), self._embed)
        cos, sin = self._cos[pos].unsqueeze(1), self._sin[pos].unsqueeze(1)
        for index, layer in enumerate(layers):
            q, kv = self._qkv(layer, x, cos, sin)
            outs = []
            offset = 0
            for seq, start, n in spans:
                end = start + n
                cache = seq.kv[index]
                cache[:, :, start:end] = kv[offset : offset + n].permute(1, 2, 0, 3)
                qi = q[offset : offset + n].transpose(0, 1).unsqueeze(0)
                keys, values = cache[0, :, :end].unsqueeze(0), cache[1, :, :end].unsqueeze(0)
                o = _attend(qi, keys, values, start)
                outs.append(o[0].transpose(0, 1).reshape(n, -1))
                offset += n
            x = self._finish_layer(layer, x, torch.cat(outs) if len(outs) > 1 else outs[0])
        last = torch.tensor(list(_cumulative_ends([n for _, _, n in spans])), dtype=torch.long)
        for (seq, _, _), prompt in zip(spans, prompts, strict=True):
            seq.tokens = list(prompt)
        return seqs, self._logits(x[last])

    def decode(self, seqs: list[SeqKV], tokens: list[int], drafts: list[list[int]] | None = None) -> torch.Tensor:
        """Feed each sequence its next token, and after it the tokens of `drafts[i]` (guesses at the positions that
        follow, checked in the same step); the logits after every token fed, one row each, a sequence's rows
        together and in order. Every token fed is appended to its sequence: the caller truncates what it rejects.
        A row's result does not depend on the other rows, so a sequence's rows are what as many steps of one
        token would compute."""
        layers = self._packed()
        if drafts is not None:
            seqs, tokens = ([seq for seq, draft in zip(seqs, drafts, strict=True) for _ in range(1 + len(draft))],
                            [t for token, draft in zip(tokens, drafts, strict=True) for t in (token, *draft)])
        positions: list[int] = []
        for seq in seqs:
            # A sequence's next row follows its previous one in this step (its tokens are appended after).
            n = seq.length if not positions or seqs[len(positions) - 1] is not seq else positions[-1] + 1
            positions.append(n)
            seq.reserve(n + 1)
        pos = torch.tensor(positions, dtype=torch.long)
        x = F.embedding(torch.tensor(tokens, dtype=torch.long), self._embed)
        cos, sin = self._cos[pos].unsqueeze(1), self._sin[pos].unsqueeze(1)
        kvs = [seq.kv for seq in seqs]
        kernel = self._attention_kernel()
        longest = NATIVE_KERNEL_LONGEST if kernel is not None and kernel.native else KERNEL_LONGEST
        attend = None if kernel is None else kernel.for_step(kvs, positions, self.heads, self.kv_heads, self.head_dim,
                                                             longest)
        kernel_tensors, kernel_rows = (None, []) if attend is None else (attend.tensors, attend.rows)
        # The fused operators come with the native kernel: where it is in use, the steps between products use them.
        fused = kernel is not None and kernel.native and self._fusable
        step = self._compiled_step()
        norms, weights, biases, modes = self._flat
        if step is not None:
            logits = step(x, cos, sin, kvs, positions, norms, weights, biases, modes, self.heads, self.kv_heads,
                          self.head_dim, self.eps, kernel_tensors, kernel_rows, fused)
        elif fused:  # the same function, not scripted
            logits = fused_layers(x, cos, sin, kvs, positions, norms, weights, modes, self.heads, self.kv_heads,
                                  self.head_dim, self.eps, kernel_tensors, kernel_rows)
        else:
            for index, layer in enumerate(layers):
                q, kv = self._qkv(layer, x, cos, sin)
                x = self._finish_layer(layer, x, self._decode_attention(index, kvs, positions, q, kv, attend))
            logits = self._logits(x)
        for seq, token in zip(seqs, tokens, strict=True):
            seq.tokens.append(token)
        return logits

    def _attention_kernel(self) -> DecodeKernels | None:
        """The compiled decode attention when it applies: asked for, built, and the model's heads fit it."""
        if not self.attention_kernel or self._embed.device.type != "cpu":
            return None
        if not DecodeKernels.supports(self.heads, self.kv_heads, self.head_dim):
            return None
        return load_decode_kernels()

    def _compiled_step(self) -> Any:
        """The scripted decode step when it applies: asked for, and every product oneDNN's or the panels'."""
        if not self.scripted or not self._packed_only:
            return None
        if self._scripted_step is None:
            self._scripted_step = compile_decode() or False
        return self._scripted_step or None

    def _decode_attention(
        self, index: int, kvs: list[torch.Tensor], positions: list[int], q: torch.Tensor, kv: torch.Tensor,
        attend: KernelStep | None,
    ) -> torch.Tensor:
        """Store each row's new key and value in layer `index`'s cache and attend its one query over its own keys
        (the compiled kernel where it is built, else row by row in torch)."""
        q = q * self.head_dim**-0.5
        return attend_step(q, kv, kvs, positions, index, self.kv_heads,
                           None if attend is None else attend.tensors, [] if attend is None else attend.rows)

    def _qkv(self, layer: _Layer, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Queries [rows, heads, dim] and new keys and values [rows, 2, kv_heads, dim], rotary embeddings applied."""
        rows, d = x.shape[0], self.head_dim
        qkv = layer.qkv(F.rms_norm(x, (x.shape[-1],), layer.norm1, self.eps)).view(rows, -1, d)
        rotated = rotate(qkv[:, : self.heads + self.kv_heads], cos, sin)  # queries and keys in one go
        kv = torch.stack((rotated[:, self.heads :], qkv[:, self.heads + self.kv_heads :]), dim=1)
        return rotated[:, : self.heads], kv

    def _finish_layer(self, layer: _Layer, x: torch.Tensor, attention: torch.Tensor) -> torch.Tensor:
        x = x + layer.out(attention)
        gate, up = layer.gate_up(F.rms_norm(x, (x.shape[-1],), layer.norm2, self.eps)).chunk(2, dim=-1)
        return x + layer.down(F.silu(gate) * up)

    def _logits(self, x: torch.Tensor) -> torch.Tensor:
        return self._head(F.rms_norm(x, (x.shape[-1],), self._norm, self.eps))


def _attend(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, start: int) -> torch.Tensor:
    """Causal attention of the queries at positions start.. over every key up to theirs ([1, heads, n, dim]).

    The CPU kernel handles queries in blocks of 32 or more from the first one, and a last block of one to three
    queries with other arithmetic. Padding such a block to four rows (copies of the last query, dropped after) makes
    every query's result independent of where its prefill started: a prompt whose start came from the prefix cache
    gets the same bits as one computed whole (with the cache resuming at a multiple of 16).
    """
    n, end = q.shape[2], keys.shape[2]
    mask = torch.arange(end)[None, :] <= torch.arange(start, end)[:, None]
    pad = 4 - n % 32 if n % 32 in (1, 2, 3) else 0
    if pad:
        q = torch.cat((q, q[:, :, -1:].expand(-1, -1, pad, -1)), dim=2)
        mask = torch.cat((mask, mask[-1:].expand(pad, -1)))
    return F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, enable_gqa=True)[:, :, :n]


def _fused(precision: Precision, panel_width: int, *linears: Any) -> PackedLinear:
    weight = torch.cat([lin.weight.detach() for lin in linears]) if len(linears) > 1 else linears[0].weight.detach()
    bias = None
    if any(getattr(lin, "bias", None) is not None for lin in linears):
        bias = torch.cat([
            lin.bias.detach() if lin.bias is not None else lin.weight.new_zeros(lin.weight.shape[0]) for lin in linears
        ])
    return PackedLinear(weight, bias, precision, panel_width)


def _cumulative_ends(lengths: list[int]) -> list[int]:
    ends, total = [], 0
    for n in lengths:
        total += n
        ends.append(total - 1)
    return ends
