"""What of a rollout's local environment and files goes into its pod, and what never does.

The local `RolloutJob.env` is agl's whole process environment plus the rollout's own variables: it can hold upstream
API keys, the gateway's admin token, local paths. A pod gets only an allow-list:

* the gateway URLs (`OPENAI_BASE_URL`, `ANTHROPIC_BASE_URL`, `AGL_REWARD_URL`), their origin rewritten to
  `kubernetes.gateway_url` so a pod can reach it;
* `OPENAI_API_KEY` / `ANTHROPIC_API_KEY` only when the matching base URL is this rollout's gateway path, i.e. the
  value is the rollout's scoped token, never a real upstream key;
* `AGL_*` rollout variables, except anything that looks like a secret;
* names the user forwards on purpose (`kubernetes.pass_env`, and the agent's own `env`/env knobs from agl.yaml).

Files the agent reads from its rollout folder (the task file, `via: file` knobs) travel base64-encoded in env vars
`AGL_FILE_<n>`; the wrapper writes them back at the same absolute paths inside the pod. An env var, not a ConfigMap:
nothing extra to create, clean up or grant RBAC for, and the Job stays one self-contained object. The price is a
size limit (Linux caps one env string at 128 KiB), checked here with a clear message.
"""

from __future__ import annotations

import base64
import fnmatch
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from rl_backend.netaddr import is_loopback_url

GATEWAY_URL_VARS = ("OPENAI_BASE_URL", "ANTHROPIC_BASE_URL", "AGL_REWARD_URL")
SCOPED_TOKEN_VARS = {"OPENAI_API_KEY": "OPENAI_BASE_URL", "ANTHROPIC_API_KEY": "ANTHROPIC_BASE_URL"}
ALWAYS_SAFE = {"PYTHONUNBUFFERED"}
# Local-machine facts that would be wrong (or harmful) inside an image, and agl's own credentials (the gateway's
# admin token, the policy servers' key), whatever the user's globs or pass_env say.
NEVER = {"PATH", "HOME", "PWD", "OLDPWD", "SHELL", "USER", "LOGNAME", "HOSTNAME", "TMPDIR", "AGL_HOME",
         "KUBECONFIG", "VIRTUAL_ENV", "PYTHONPATH", "LD_LIBRARY_PATH", "LD_PRELOAD", "AGL_GATEWAY_ADMIN_TOKEN",
         "AGL_POLICY_API_KEY"}
_SECRET_NAME = re.compile(r"KEY|TOKEN|SECRET|PASSW|CREDENTIAL|AUTH|COOKIE|SESSION", re.IGNORECASE)
_STRONG_SECRET_NAME = re.compile(r"KEY|TOKEN|SECRET|PASSW", re.IGNORECASE)
MAX_FILE_BYTES = 96 * 1024  # base64 grows it by 4/3: stays under the kernel's 128 KiB per env string
MAX_FILES_BYTES = 512 * 1024  # the whole Job object must stay well under etcd's 1.5 MiB
MIN_SECRET_LEN = 8  # shorter values ("1", "true") are not worth scanning the manifest for


class PodEnvError(ValueError):
    """This rollout cannot be expressed as a pod (a file too big to ship)."""


class UnreachableGatewayError(ValueError):
    """The gateway listens where no pod can reach it: every rollout would fail the same way."""


def looks_secret(name: str) -> bool:
    return bool(_SECRET_NAME.search(name))


@dataclass(frozen=True)
class PodEnv:
    env: dict[str, str]  # what goes into the container, in name order
    files: list[tuple[str, str]]  # (absolute path inside the pod, env var holding its base64 content)
    withheld: list[str]  # values that must never appear in a manifest (dropped secrets), for the leak check


def _rewrite_gateway(value: str, rollout_id: str, gateway_url: str | None) -> str:
    marker = f"/rollouts/{rollout_id}/"
    at = value.find(marker)
    if at < 0:
        return value
    origin = value[:at]
    if gateway_url is not None:
        return gateway_url + value[at:]
    if is_loopback_url(origin):
        raise UnreachableGatewayError(
            f"the gateway listens on {origin}, which no pod can reach; set kubernetes.gateway_url to an address "
            "of this machine that the cluster can reach (and start the gateway on it)"
        )
    return value


def _worth_guarding(name: str, value: str, deny: set[str]) -> bool:
    # Paths and short flags are not secrets and would make the leak check cry wolf (the manifest holds paths).
    if len(value) < MIN_SECRET_LEN or value.startswith(("/", ".")):
        return False
    return name in deny or name in SCOPED_TOKEN_VARS or bool(_STRONG_SECRET_NAME.search(name))


def _forwarded(name: str, patterns: Iterable[str]) -> bool:
    for pattern in patterns:
        if name == pattern:
            return True
        # A glob never carries a secret-looking name along: those must be listed one by one, on purpose.
        if fnmatch.fnmatchcase(name, pattern) and not looks_secret(name):
            return True
    return False


def pod_env(
    env: dict[str, str],
    rollout_id: str,
    *,
    gateway_url: str | None,
    pass_env: Iterable[str] = (),
    deny_env: Iterable[str] = (),
) -> tuple[dict[str, str], list[str]]:
    """Filter a rollout's local env to what its pod may see; also return the withheld secret values."""
    deny = set(deny_env)
    patterns = list(pass_env)
    kept: dict[str, str] = {}
    marker = f"/rollouts/{rollout_id}/"
    for name, value in env.items():
        if name in SCOPED_TOKEN_VARS:
            # The key is the rollout's own token only when its SDK is pointed at this rollout's gateway path.
            if marker in env.get(SCOPED_TOKEN_VARS[name], "") and name not in deny:
                kept[name] = value
        elif name in deny or name in NEVER:
            continue
        elif name in GATEWAY_URL_VARS:
            kept[name] = _rewrite_gateway(value, rollout_id, gateway_url)
        elif (name.startswith("AGL_") and not looks_secret(name)) or name in ALWAYS_SAFE or _forwarded(name, patterns):
            kept[name] = value
    withheld = [value for name, value in env.items() if name not in kept and _worth_guarding(name, value, deny)]
    return dict(sorted(kept.items())), withheld


def rollout_files(rollout_dir: Path, skip: Iterable[Path] = ()) -> list[tuple[str, bytes]]:
    """Every regular file of the rollout folder (task file, rendered `via: file` knobs), to be recreated in the pod."""
    skipped = {p.resolve() for p in skip}
    found: list[tuple[str, bytes]] = []
    total = 0
    if not rollout_dir.is_dir():
        return found
    for path in sorted(rollout_dir.rglob("*")):
        if not path.is_file() or path.resolve() in skipped:
            continue
        data = path.read_bytes()
        if len(data) > MAX_FILE_BYTES:
            raise PodEnvError(
                f"{path} is {len(data)} bytes; a file shipped into a pod may have at most {MAX_FILE_BYTES} "
                "(it travels in an environment variable). Make the task smaller or let the image hold the data"
            )
        total += len(data)
        if total > MAX_FILES_BYTES:
            raise PodEnvError(f"the files of {rollout_dir} add up to more than {MAX_FILES_BYTES} bytes")
        found.append((str(path), data))
    return found


def build_pod_env(
    env: dict[str, str],
    rollout_id: str,
    rollout_dir: Path,
    *,
    gateway_url: str | None,
    fixed_env: dict[str, str],
    pass_env: Iterable[str] = (),
    deny_env: Iterable[str] = (),
) -> PodEnv:
    kept, withheld = pod_env(env, rollout_id, gateway_url=gateway_url, pass_env=pass_env, deny_env=deny_env)
    # The pod's uid need not own a home in the image, and its root filesystem is read-only: tools that write under
    # $HOME (pip, git, caches) get the writable /tmp emptyDir unless agent.env/kubernetes.env say otherwise.
    kept["HOME"] = "/tmp"
    kept.update(fixed_env)  # the spec's fixed values are the user's explicit choice for the pod
    output = env.get("AGL_OUTPUT_FILE")
    files = rollout_files(rollout_dir, skip=[Path(output)] if output else [])
    shipped: list[tuple[str, str]] = []
    for index, (path, data) in enumerate(files):
        var = f"AGL_FILE_{index}"
        kept[var] = base64.b64encode(data).decode("ascii")
        shipped.append((path, var))
    return PodEnv(env=kept, files=shipped, withheld=withheld)
