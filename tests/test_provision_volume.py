"""A checkpoint volume the trainer cannot write (a network filesystem that ignores the pod's fsGroup) stops the
trainer at once, exit 2, naming the volume, its claim, the uid it ran as and what to set: not minutes later inside
Ray or verl. The trainer runs as the pod's uid 10001 without capabilities, as in the cluster."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest

from agl_cli.training.volume_check import check_checkpoint_volume
from rl_backend.provision.session import dry_run
from tests.test_provision_support import NAMES, fast_schemas, load_target, options, write_project  # noqa: F401

pytestmark = pytest.mark.timeout(120)
REPO = Path(__file__).resolve().parents[1]
POD_UID = 10001


def _trainer_containers(manifests: list[dict[str, Any]]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    found = []
    for manifest in manifests:
        if manifest["kind"] == "Job":
            pod = manifest["spec"]["template"]["spec"]
            found.append((pod, pod["containers"][0]))
        if manifest["kind"] == "RayJob":
            cluster = manifest["spec"]["rayClusterSpec"]
            for group in (cluster["headGroupSpec"], cluster["workerGroupSpecs"][0]):
                found.append((group["template"]["spec"], group["template"]["spec"]["containers"][0]))
    return found


@pytest.mark.parametrize("extra", [{"gpus": 1}, {"gpus": 16, "nodes": 2}])
def test_the_trainer_is_told_which_volume_and_claim_it_checks(tmp_path: Path, extra: dict[str, Any]) -> None:
    manifests = dry_run(load_target(write_project(tmp_path)), options(**extra)).manifests
    for pod, container in _trainer_containers(manifests):
        env = {e["name"]: e.get("value") for e in container["env"]}
        mount = next(m for m in container["volumeMounts"] if m["name"] == "checkpoints")
        claim = next(v for v in pod["volumes"] if v["name"] == "checkpoints")["persistentVolumeClaim"]["claimName"]
        assert env["AGL_CHECKPOINT_DIR"] == mount["mountPath"] and env["AGL_CHECKPOINT_CLAIM"] == claim
        assert claim == NAMES.checkpoints


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None,
                    reason="running the trainer as the pod's uid needs root and setpriv (util-linux)")
def test_a_volume_that_ignores_fsgroup_stops_the_trainer_at_once_saying_what_to_set() -> None:
    top = Path(tempfile.mkdtemp())
    try:
        os.chmod(top, 0o755)
        project = top / "calc"
        shutil.copytree(REPO / "examples" / "calc", project)
        volume = top / "checkpoints"  # root's, 0755: what a filesystem that ignored fsGroup leaves
        volume.mkdir(mode=0o755)
        for path in [project, *project.rglob("*")]:
            os.chmod(path, 0o755 if path.is_dir() else 0o644)
        env = {"PATH": os.environ["PATH"], "HOME": "/tmp", "AGL_CHECKPOINT_DIR": str(volume),
               "AGL_CHECKPOINT_CLAIM": "agl-calc-checkpoints", "AGL_HOME": str(volume / "agl"),
               "AGL_MODEL_CACHE": str(volume / "models")}
        done = subprocess.run(["setpriv", f"--reuid={POD_UID}", f"--regid={POD_UID}", f"--groups={POD_UID}",
                               "--bounding-set=-all", "--inh-caps=-all", "--no-new-privs", "--",
                               sys.executable, "-m", "agl_cli", "train", "agl.yaml", "--backend", "verl",
                               "--device", "cpu", "--steps", "1"],
                              cwd=project, env=env, capture_output=True, text=True, timeout=100)
        assert done.returncode == 2, done.stderr[-2000:]
        message = done.stderr
        assert f"the checkpoint volume {volume} (PersistentVolumeClaim agl-calc-checkpoints) is not writable" in message
        assert f"uid {POD_UID}" in message and "its root is uid 0, gid 0, mode 755" in message
        assert "fsGroup" in message and f"posixUser {POD_UID}:{POD_UID}" in message and "--storage-class" in message
        assert "Traceback" not in message and list(volume.iterdir()) == []  # nothing written, no model converted
    finally:
        shutil.rmtree(top, ignore_errors=True)


def test_a_writable_volume_passes_and_keeps_nothing(tmp_path: Path) -> None:
    check_checkpoint_volume({"AGL_CHECKPOINT_DIR": str(tmp_path)})
    assert list(tmp_path.iterdir()) == []
    check_checkpoint_volume({})  # a local train: no volume to check


def test_a_volume_that_cannot_be_a_folder_is_named_too(tmp_path: Path) -> None:
    from agl_cli.errors import ConfigError

    (tmp_path / "a-file").write_text("")
    with pytest.raises(ConfigError, match="not writable") as missing:
        check_checkpoint_volume({"AGL_CHECKPOINT_DIR": str(tmp_path / "a-file" / "ckpt"), "AGL_CHECKPOINT_CLAIM": "c"})
    assert missing.value.exit_code == 2 and "PersistentVolumeClaim c" in missing.value.message
