"""Gateways and fast fake upstreams as real processes, for tests and benchmarks that need them apart.

`spawn_gateway` runs `agl gateway serve` exactly as a person would (its own process, its own event loop), so load
and crash tests exercise the stand-alone gateway, not an in-process copy sharing the test's GIL. The caller says how
to start that command (`serve`: e.g. `["agl", "gateway", "serve"]`): the command line is agl_cli's, and nothing
under rl_backend reaches up into it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx


@dataclass
class Proc:
    proc: subprocess.Popen[str]
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return str(self.info["url"])

    @property
    def pid(self) -> int:
        return self.proc.pid

    def stop(self, timeout_s: float = 15.0) -> int:
        """SIGTERM (a gateway finishes its calls and closes its store), then SIGKILL if it lingers."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        return int(self.proc.returncode)

    def kill(self) -> None:
        """SIGKILL: no chance to flush or clean up (the crash a test wants)."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)


def _read_ready(proc: subprocess.Popen[str], timeout_s: float) -> dict[str, Any]:
    """The first JSON document the process prints on stdout (it may span lines)."""
    assert proc.stdout is not None
    timer = threading.Timer(timeout_s, proc.kill)
    timer.start()
    buf = ""
    try:
        while True:
            line = proc.stdout.readline()
            if not line:
                raise RuntimeError(f"process {proc.args!r} exited (rc={proc.poll()}) before it was ready")
            buf += line
            try:
                doc = json.loads(buf)
            except ValueError:
                continue
            if isinstance(doc, dict):
                return doc
    finally:
        timer.cancel()


def spawn_fast_fake(timeout_s: float = 60.0) -> Proc:
    proc = subprocess.Popen(
        [sys.executable, "-m", "rl_backend.gateway.fake.fast"], stdout=subprocess.PIPE, stdin=subprocess.DEVNULL,
        text=True,
    )
    return Proc(proc, _read_ready(proc, timeout_s))


def spawn_serve(serve: Sequence[str], args: list[str], *, admin_token: str = "", cwd: Path | None = None,
                timeout_s: float = 60.0) -> Proc:
    """`SERVE --port 0 --json ARGS…` (SERVE: the command line of `agl gateway serve`), the admin token in its
    environment ("" for none)."""
    command = [*serve, "--port", "0", "--json", *args]
    env = {**os.environ, "AGL_GATEWAY_ADMIN_TOKEN": admin_token, "NO_COLOR": "1"}
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True, env=env, cwd=cwd)
    return Proc(proc, _read_ready(proc, timeout_s))


def spawn_gateway(serve: Sequence[str], upstream_url: str, store: Path, *, admin_token: str = "test-admin",
                  token_ids: bool = True, extra: list[str] | None = None, timeout_s: float = 60.0) -> Proc:
    """`agl gateway serve` (started by the command line `serve`) in front of one OpenAI-compatible upstream named
    `local`, on a free port."""
    args = ["--upstream", f"local=openai-compatible:{upstream_url}", "--store", str(store),
            *(["--token-ids", "local"] if token_ids else []), *(extra or [])]
    return spawn_serve(serve, args, admin_token=admin_token, timeout_s=timeout_s)


def register(gateway_url: str, admin_token: str, rollout_id: str, knobs: dict[str, Any] | None = None) -> dict[str, Any]:
    """POST /admin/rollouts: the rollout's token and base URLs."""
    r = httpx.post(f"{gateway_url}/admin/rollouts", json={"rollout_id": rollout_id, "knobs": knobs or {}},
                   headers={"authorization": f"Bearer {admin_token}"}, timeout=30)
    r.raise_for_status()
    result: dict[str, Any] = r.json()
    return result
