"""The trainer Job's own Ray, started as the trainer starts it (`ray start --head` with the pinned ports of
rl_backend/trainer/verl_backend/ray_head.py), listens on those ports and on Ray's fixed metric ports only: nothing
of it lands in the ephemeral range, which in the pod is the policy servers' range, open to the gateway. And it
refuses a caller without its token: the grader container shares the pod's network but not the trainer's
environment, where the token is.

The test pins ports of its own (the rendered ones, 6379 and so on, may be taken on a shared machine) and a temp
folder of its own, and ends exactly the processes that carry that folder (never `ray stop`, which ends every Ray
of this user). Workers' ports (min/max-worker-port) need a driver; a driver cannot connect where the machine's own
address is unroutable, so they are covered by the rendered-plan test (tests/test_provision_isolation.py) only.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rl_backend.provision.options import POLICY_PORTS
from rl_backend.provision.plan import RAY_HEAD_PORTS
from rl_backend.trainer.verl_backend.ray_head import start_head

pytestmark = [pytest.mark.timeout(180),
              pytest.mark.skipif(not sys.platform.startswith("linux"), reason="listeners read from Linux's /proc")]
BASE = 23400 + os.getpid() % 500 * 20


def _ours(marker: str) -> list[object]:
    import psutil

    found = []
    for process in psutil.process_iter(["cmdline"]):
        try:
            if any(marker in arg for arg in process.info["cmdline"] or []):
                found.append(process)
        except psutil.Error:
            pass
    return found


def _listening(processes: list[object]) -> dict[int, str]:
    import psutil

    ports: dict[int, str] = {}
    for process in processes:
        try:
            for conn in process.net_connections(kind="inet"):  # type: ignore[attr-defined]
                if conn.status == psutil.CONN_LISTEN:
                    ports[conn.laddr.port] = process.name()  # type: ignore[attr-defined]
        except psutil.Error:
            pass
    return ports


def test_the_jobs_ray_head_listens_only_where_it_was_told_and_requires_its_token(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import ray
    from ray.autoscaler._private.constants import AUTOSCALER_METRIC_PORT
    from ray.dashboard.consts import DASHBOARD_METRIC_PORT

    # Every flag the pod renders, each moved to a port of this test's own.
    ports = {flag: str(BASE + i) for i, flag in enumerate(f for f in RAY_HEAD_PORTS if "worker-port" not in f)}
    ports |= {"min-worker-port": str(BASE + 12), "max-worker-port": str(BASE + 19)}
    metric_ports = {"AUTOSCALER_METRIC_PORT": str(BASE + 10), "DASHBOARD_METRIC_PORT": str(BASE + 11)}
    temp = f"/tmp/agl-rh-{secrets.token_hex(4)}"  # short: Ray's unix sockets live under it
    ray_bin = str(Path(sys.executable).parent / "ray")
    for name in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN"):
        # start_head sets them in this process. setenv first: monkeypatch records only a variable it changed, and
        # an absent one it merely "deleted" would stay set after the test, so every later ray.init in this pytest
        # process would start a Ray that demands a token its driver does not send.
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)
    for name, value in metric_ports.items():
        monkeypatch.setenv(name, value)
    try:
        assert start_head(ports, 1, temp_dir=temp) == "auto"
        assert os.environ["RAY_AUTH_MODE"] == "token" and len(os.environ["RAY_AUTH_TOKEN"]) == 64
        listening: dict[int, str] = {}
        for _ in range(40):  # the agents come up after `ray start` returns
            time.sleep(0.25)
            listening = _listening(_ours(temp))
            if len(listening) >= 4:
                break
        allowed = {int(p) for p in ports.values()} | {int(p) for p in metric_ports.values()}
        assert listening and set(listening) <= allowed, {p: n for p, n in listening.items() if p not in allowed}
        assert {BASE, int(ports["node-manager-port"])} <= set(listening)  # GCS and raylet: really started
        # What the grader container (same network, no token) gets from Ray, and what the trainer gets.
        outsider = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH")}
        for env, code in ((outsider, 1), ({**outsider, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": "0" * 64}, 1),
                          (dict(os.environ), 0)):
            status = subprocess.run([ray_bin, "status", f"--address=127.0.0.1:{BASE}"], env=env, capture_output=True,
                                    text=True, timeout=90)
            assert status.returncode == code, (code, status.stdout[-500:], status.stderr[-500:])
    finally:
        for process in _ours(temp):
            with contextlib.suppress(Exception):  # it may have exited on its own
                process.kill()  # type: ignore[attr-defined]
        shutil.rmtree(temp, ignore_errors=True)
    # In the pod those two metric ports keep Ray's defaults: outside the range the gateway may reach.
    low, high = POLICY_PORTS
    assert not low <= AUTOSCALER_METRIC_PORT <= high and not low <= DASHBOARD_METRIC_PORT <= high
    assert ray.__version__
