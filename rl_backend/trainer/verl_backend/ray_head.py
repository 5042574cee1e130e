"""A Ray of the trainer's own with every listener on a port the pod names: `ray start --head` before ray.init.

In a trainer Job's pod the kernel's ephemeral port range is narrowed to the policy servers' range (40000-40999), the
only ports of the pod the gateway may reach (templates/k8s/provision/netpol-policy.yaml.j2). `ray.init()` starting
a local Ray takes every port it does not get told (GCS, raylet, object manager, dashboard and metrics agents,
runtime-env agent, workers) from that same range, so the gateway could reach Ray, which has no authentication.
ray.init cannot pin most of them; `ray start --head` can. The pod says which ports in $AGL_RAY_HEAD_PORTS (a JSON
object of `ray start` flags to values, rl_backend/provision/plan.py); the trainer then starts that head and
connects to it. Without the variable (a local train) nothing changes: ray.init starts Ray as before.

That head also requires a token on every call (Ray's token authentication, RAY_AUTH_MODE=token, where the installed
Ray has it; ray.init enables it by default for a Ray it starts, `ray start` does not): the pod's grader container
shares the pod's network, so it reaches Ray's ports, and without the token, which only the trainer's container
holds (its environment, inherited by Ray's processes), Ray refuses it.
"""

from __future__ import annotations

import importlib.util
import json
import os
import secrets
import shutil
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

RAY_HEAD_PORTS_ENV = "AGL_RAY_HEAD_PORTS"
START_TIMEOUT_S = 180.0


class RayHeadError(RuntimeError):
    """The pinned head could not be started: the message says with what and why."""


def pinned_ports(environ: Mapping[str, str]) -> dict[str, str] | None:
    """The `ray start` port flags the pod pins ({"port": "6379", "node-manager-port": "6380", ...}), or None."""
    text = environ.get(RAY_HEAD_PORTS_ENV, "").strip()
    if not text:
        return None
    try:
        ports = json.loads(text)
    except ValueError:
        raise RayHeadError(f"${RAY_HEAD_PORTS_ENV} is not JSON: {text[:200]!r}") from None
    if not isinstance(ports, dict) or not all(isinstance(v, (str, int)) and str(v).isdigit() for v in ports.values()):
        raise RayHeadError(f"${RAY_HEAD_PORTS_ENV} must map `ray start` flags to port numbers: {text[:200]!r}")
    return {str(k): str(v) for k, v in ports.items()}


def start_args(ports: Mapping[str, str], num_cpus: int | None) -> list[str]:
    """`ray start --head` with the pinned ports, no dashboard (nothing in the pod submits jobs to it)."""
    args = ["start", "--head", "--include-dashboard=false", "--disable-usage-stats"]
    if num_cpus is not None:
        args.append(f"--num-cpus={num_cpus}")
    args += [f"--{flag}={value}" for flag, value in ports.items()]
    return args


def require_token(environ: dict[str, str] | os._Environ[str]) -> bool:
    """Turn on Ray's token authentication in `environ` (this process's: `ray start` and ray.init both read it) with a
    new token, unless RAY_AUTH_MODE is set already (the operator's choice) or this Ray has no such thing."""
    if "RAY_AUTH_MODE" in environ:
        return environ["RAY_AUTH_MODE"].lower() == "token"
    if importlib.util.find_spec("ray._private.authentication.authentication_token_setup") is None:
        return False
    environ["RAY_AUTH_MODE"] = "token"
    environ["RAY_AUTH_TOKEN"] = secrets.token_hex(32)
    return True


def start_head(ports: Mapping[str, str], num_cpus: int | None, *, temp_dir: str | None = None) -> str:
    """Start the head (requiring a token where Ray can); returns the address ray.init connects to. The container's
    exit ends its processes. `temp_dir`: Ray's folder, when not its default."""
    ray = shutil.which("ray", path=str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", ""))
    if ray is None:
        raise RayHeadError("`ray` is not on the PATH next to agl's python: the trainer image installs it with verl")
    require_token(os.environ)
    argv = [ray, *start_args(ports, num_cpus), *([f"--temp-dir={temp_dir}"] if temp_dir else [])]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=START_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise RayHeadError(f"`ray start --head` did not finish within {START_TIMEOUT_S:g} s") from None
    if done.returncode != 0:
        last = (done.stderr.strip() or done.stdout.strip()).splitlines()[-5:]
        raise RayHeadError(f"`{' '.join(argv[1:])}` exited with {done.returncode}: " + " / ".join(last))
    return "auto"  # the head this container just started (Ray records it under its temp folder)
