"""Before a cluster trainer writes anything: is the checkpoint volume writable by this uid? Say so at once if not.

The trainer's pods run as uid 10001 with `fsGroup: 10001`, which makes a volume's root group-writable for them. Many
network filesystems ignore fsGroup (EFS and Filestore through their CSI drivers, NFS exports with root_squash): the
root stays root's, and the train would fail minutes later, deep in Ray or verl, at its first checkpoint or run
folder. The pod names the volume ($AGL_CHECKPOINT_DIR, $AGL_CHECKPOINT_CLAIM, rl_backend/provision/plan.py); this
check writes and removes one file there and, when Linux says no, stops with the uid and groups it tried as and what
to set. An init container that chowns the volume would have to run as root, which restricted namespaces refuse and
root_squash defeats, so agl does not add one.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Mapping
from pathlib import Path

from agl_cli.errors import ConfigError

CHECKPOINT_DIR_ENV = "AGL_CHECKPOINT_DIR"
CHECKPOINT_CLAIM_ENV = "AGL_CHECKPOINT_CLAIM"


def check_checkpoint_volume(environ: Mapping[str, str] = os.environ) -> None:
    """Nothing outside a cluster trainer (no $AGL_CHECKPOINT_DIR); a ConfigError (exit 2) when it is not writable."""
    folder = environ.get(CHECKPOINT_DIR_ENV, "").strip()
    if not folder:
        return
    probe = Path(folder) / f".agl-write-check-{secrets.token_hex(4)}"
    try:
        probe.parent.mkdir(parents=True, exist_ok=True)  # a pod mounts it; elsewhere (a test) it may be made here
        probe.write_bytes(b"")
        probe.unlink()
        return
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
    claim = environ.get(CHECKPOINT_CLAIM_ENV, "").strip()
    volume = f"{folder} (PersistentVolumeClaim {claim})" if claim else folder
    uid, gid, groups = os.getuid(), os.getgid(), sorted(set(os.getgroups()) - {os.getgid()})
    try:
        info = os.stat(folder)
        owner = f"; its root is uid {info.st_uid}, gid {info.st_gid}, mode {info.st_mode & 0o7777:o}"
    except OSError:
        owner = ""
    raise ConfigError(
        f"the checkpoint volume {volume} is not writable by this trainer (uid {uid}, gid {gid}, groups "
        f"{', '.join(map(str, groups)) or 'none'}): {reason}{owner}. Its filesystem likely ignores the pod's "
        "fsGroup (EFS, Filestore and NFS exports often do)",
        hint=f"make the volume's root writable by uid {uid} or group {gid}: an EFS access point with "
             f"posixUser {uid}:{gid} (EFS CSI StorageClass: uid/gid parameters), a Filestore or NFS export "
             f"chowned to {uid}:{gid}, or a StorageClass whose driver applies fsGroup; then run the train again "
             "(--storage-class picks the class)")
