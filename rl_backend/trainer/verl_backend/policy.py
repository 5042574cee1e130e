"""The policy server: vLLM's OpenAI-compatible server, started by the trainer on the GPUs it trains on, reached by
the gateway at AGL_POLICY_URL; and new weights pushed to it between updates.

The server answers to the embedded upstream's model name (`served_name`: what the gateway forwards, unchanged).
LoRA (recommended): the server starts with `--enable-lora` and the adapter under that name; after each update the
new adapter is swapped in through vLLM's documented runtime endpoints `POST /v1/unload_lora_adapter` and
`POST /v1/load_lora_adapter` (which need VLLM_ALLOW_RUNTIME_LORA_UPDATING=True). Nothing is in flight then (the
sync loop has collected its batch).
Full fine-tuning: vLLM documents no HTTP endpoint that replaces a served model's weights, so the server is
restarted on the checkpoint's Hugging Face model folder: slow for large models, but only documented mechanisms.

UNTESTED here: vLLM needs CUDA and cannot be installed on the machines this was written on.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx


@dataclass(frozen=True)
class PolicyServerConfig:
    model_path: str
    served_name: str  # the `model` of the agl.yaml embedded upstream: the gateway asks for it
    port: int = 8000
    host: str = "0.0.0.0"  # the gateway is another pod: it reaches this one through the Service names.policy
    tensor_parallel: int = 1
    gpu_memory_utilization: float = 0.4
    max_model_len: int = 6144
    lora_rank: int = 0  # 0: full fine-tuning (restart to update)


class PolicyServer:
    """One `vllm serve` process; `url` is what AGL_POLICY_URL names (…/v1)."""

    def __init__(self, config: PolicyServerConfig, *, log_path: Path) -> None:
        self.config = config
        self.log_path = log_path
        self.proc: subprocess.Popen[bytes] | None = None
        self.adapter: Path | None = None
        self.model_path = config.model_path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.config.port}/v1"

    def command(self, adapter: Path | None = None) -> list[str]:
        cfg = self.config
        cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", self.model_path,
               "--host", cfg.host, "--port", str(cfg.port), "--tensor-parallel-size", str(cfg.tensor_parallel),
               "--gpu-memory-utilization", str(cfg.gpu_memory_utilization), "--max-model-len", str(cfg.max_model_len),
               "--enable-prefix-caching"]
        if cfg.lora_rank:
            cmd += ["--enable-lora", "--max-lora-rank", str(cfg.lora_rank), "--max-loras", "1"]
            if adapter is not None:
                cmd += ["--lora-modules", f"{cfg.served_name}={adapter}"]
        else:
            cmd += ["--served-model-name", cfg.served_name]
        return cmd

    def start(self, adapter: Path | None = None, timeout_s: float = 1800.0) -> None:
        env = {**os.environ, "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True"}
        log = self.log_path.open("ab")
        self.proc = subprocess.Popen(self.command(adapter), stdout=log, stderr=subprocess.STDOUT, env=env)
        self.adapter = adapter
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"vLLM exited with {self.proc.returncode} while starting; see {self.log_path}")
            try:
                if httpx.get(self.url.removesuffix("/v1") + "/health", timeout=5).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(2)
        raise RuntimeError(f"vLLM did not answer /health within {timeout_s:.0f} s; see {self.log_path}")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self.proc = None

    def push_adapter(self, adapter: Path) -> None:
        """Serve `adapter` (a peft folder) under the served name from the next request on."""
        base = self.url.removesuffix("/v1")
        if self.adapter is not None:
            unload = {"lora_name": self.config.served_name}
            httpx.post(f"{base}/v1/unload_lora_adapter", json=unload, timeout=120).raise_for_status()
        r = httpx.post(f"{base}/v1/load_lora_adapter", json={"lora_name": self.config.served_name, "lora_path": str(adapter)},
                       timeout=600)
        if r.status_code >= 400:
            raise RuntimeError(f"vLLM refused the adapter {adapter}: {r.status_code} {r.text[:300]}")
        self.adapter = adapter

    def push_full_weights(self, hf_folder: Path) -> None:
        """Full fine-tuning: serve the Hugging Face folder of the new weights (a restart, see the module docstring)."""
        self.stop()
        self.model_path = str(hf_folder)
        self.start()
