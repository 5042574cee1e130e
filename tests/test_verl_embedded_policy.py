"""The embedded policy server's LoRA hot-load (rl_backend/trainer/verl_backend/embedded_policy.py): the adapter
verl syncs arrives as CPU tensors, while the server's base weights live where its model runs (CUDA on a GPU)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from rl_backend.trainer.verl_backend.embedded_policy import merge_adapter  # noqa: E402


def test_an_adapter_from_the_cpu_merges_onto_base_weights_on_another_device() -> None:
    """The base on torch's `meta` device stands in for a GPU here: any device other than the adapter's CPU."""
    base = {"layer.q_proj.weight": torch.zeros(4, 4, dtype=torch.bfloat16, device="meta"),
            "layer.norm.weight": torch.ones(4, device="meta")}
    adapter = {"base_model.model.layer.q_proj.lora_A.weight": torch.ones(2, 4),
               "base_model.model.layer.q_proj.lora_B.weight": torch.ones(4, 2)}
    merged = merge_adapter(base, adapter, {"r": 2, "lora_alpha": 4})
    weight = merged["layer.q_proj.weight"]
    assert weight.device.type == "meta" and weight.dtype == torch.bfloat16 and weight.shape == (4, 4)
    assert merged["layer.norm.weight"] is base["layer.norm.weight"]


def test_the_merge_is_base_plus_scaled_b_times_a() -> None:
    base = {"layer.q_proj.weight": torch.full((3, 2), 0.5)}
    a, b = torch.tensor([[1.0, 2.0]]), torch.tensor([[1.0], [0.0], [-1.0]])
    merged = merge_adapter(base, {"layer.q_proj.lora_A.weight": a, "layer.q_proj.lora_B.weight": b},
                           {"r": 1, "lora_alpha": 2})
    assert torch.equal(merged["layer.q_proj.weight"], base["layer.q_proj.weight"] + 2 * (b @ a))
