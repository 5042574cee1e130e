"""`agl train status`: a train's objects (found by its label), whether it is up, and its last step metrics.

Everything is derived from the cluster alone (no local state): the trainer's kind and node count are read back
from the trainer object itself, so status works from any machine with access to the namespace.
"""

from __future__ import annotations

from typing import Any

from rl_backend.provision.metric_rows import parse_rows
from rl_backend.provision.metrics import last_metrics, log_source
from rl_backend.provision.options import LABEL_COMPONENT, LABEL_MANAGED, LABEL_TRAIN, Names
from rl_backend.provision.plan import Topology
from rl_backend.provision.readiness import trainer_finished
from rl_backend.provision.resources import APPLY_ORDER, Resources
from rl_backend.provision.wait import gather

TAIL_LINES = 500


def list_trains(res: Resources) -> list[str]:
    """The trains in the namespace: every value of agl.dev/train on an agl-managed ConfigMap (each train has one)."""
    found = {((c.get("metadata") or {}).get("labels") or {}).get(LABEL_TRAIN)
             for c in res.objects("ConfigMap", {LABEL_MANAGED: "agl"})}
    return sorted(name for name in found if name)


def topology_of(trainer: dict[str, Any]) -> Topology:
    if trainer.get("kind") == "RayJob":
        groups = ((trainer.get("spec") or {}).get("rayClusterSpec") or {}).get("workerGroupSpecs") or [{}]
        nodes = int(groups[0].get("replicas") or 1)
        per_node = int((groups[0].get("rayStartParams") or {}).get("num-gpus") or 0)
        return Topology("rayjob", nodes, per_node, "read back from the RayJob")
    containers = (((trainer.get("spec") or {}).get("template") or {}).get("spec") or {}).get("containers") or [{}]
    gpus = int(((containers[0].get("resources") or {}).get("limits") or {}).get("nvidia.com/gpu") or 0)
    return Topology("job", 1, gpus, "read back from the Job")


def train_status(res: Resources, names: Names) -> dict[str, Any]:
    """One JSON-able document: objects, checks, phase, last metrics."""
    objects = []
    for kind in APPLY_ORDER:
        for obj in res.objects(kind, names.selector()):
            meta = obj.get("metadata") or {}
            objects.append({"kind": kind, "name": meta.get("name"),
                            "component": (meta.get("labels") or {}).get(LABEL_COMPONENT),
                            "created": meta.get("creationTimestamp")})
    trainer = next((res.read(k, names.trainer) for k in ("Job", "RayJob")
                    if any(o["kind"] == k and o["name"] == names.trainer for o in objects)), None)
    document: dict[str, Any] = {"train": names.train, "namespace": res.namespace, "objects": objects,
                                "phase": "not found" if not objects else "incomplete", "checks": [],
                                "last_metrics": None, "trainer": None}
    if trainer is None:
        return document
    topology = topology_of(trainer)
    document["trainer"] = {"kind": trainer.get("kind"), "name": names.trainer, "nodes": topology.nodes,
                           "gpus_per_node": topology.gpus_per_node}
    checks = gather(res, names, topology)
    document["checks"] = [{"name": c.key, "label": c.label, "state": c.state(), "detail": c.failure or c.detail}
                          for c in checks]
    finished = trainer_finished(trainer)
    if finished is not None:
        document["phase"] = finished[0]
        document["trainer"]["detail"] = finished[1]
    elif any(c.failure for c in checks):
        document["phase"] = "failing"
    else:
        document["phase"] = "running" if all(c.ready for c in checks) else "starting"
    stored = res.read("ConfigMap", names.metrics)
    if stored is not None:  # the trainer's own record of its rows (metric_rows.py): no log rotation loses it
        rows, _ = parse_rows(stored)
        document["last_metrics"] = rows[-1] if rows else None
    elif (source := log_source(res, names, topology)) is not None:  # a train planned by an older agl
        document["last_metrics"] = last_metrics(res.pod_log(source[0], source[1], tail_lines=TAIL_LINES))
    return document
