"""Applying a train's manifests idempotently, rolling back on failure, and deleting a train by its label.

Before anything is written, the trainer decides the run: an existing trainer (a Job or RayJob, whose pod template
is immutable) is kept when its spec hash is unchanged and it is still running, replaced when it has finished (a
re-run resumes from the checkpoints), and otherwise refused — changing a running trainer is `agl train stop` and a
new provision, said in so many words — and a refusal leaves every object as it was (a patched ConfigMap or a new
config hash would restart the gateway under the running trainer).

Then create-or-patch, per object in dependency order: create; on 409 read the existing object and, if it is this
train's (its label says so), merge-patch it — except for what must not change under running pods:
- the generated Secrets are kept as they are (the running gateway and trainer hold those tokens);
- a PersistentVolumeClaim is kept (its spec is immutable once bound; its data is the point).
An object of the same name that is not this train's is never touched.

The first object (the ConfigMap) is the train's owner: every later one but the volumes gets an ownerReference to
it, so deleting it garbage-collects the train (`agl train stop` deletes by label all the same).

Every object this run created is recorded; on any failure they are deleted again in reverse order, so a failed
provision leaves nothing behind (objects that existed before it are left as they were). A create that failed
ambiguously (a 5xx, a dropped connection) may have been stored anyway: it is retried, and a 409 on the retry that
finds this run's own provision id adopts the object as created; at rollback it is looked up and deleted if ours.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from rl_backend.provision.options import ANNOTATION_PROVISION, ANNOTATION_SPEC_HASH, LABEL_TRAIN, Names, ProvisionError
from rl_backend.provision.plan import TOKEN_PLACEHOLDER
from rl_backend.provision.readiness import trainer_finished
from rl_backend.provision.resources import APPLY_ORDER, Resources, api_error

RETRYABLE = {429, 500, 502, 503, 504}
KEPT_KINDS = {"Secret", "PersistentVolumeClaim"}
TRAINER_KINDS = {"Job", "RayJob"}
OWNER_KIND = "ConfigMap"
UNOWNED_KINDS = {"PersistentVolumeClaim"}  # checkpoints and the store outlive the train's deletion on purpose


@dataclass
class Step:
    kind: str
    name: str
    action: str  # created | patched | kept | replaced


@dataclass
class Applier:
    res: Resources
    names: Names
    provision_id: str
    attempts: int = 3
    backoff_s: float = 0.5
    log: Callable[[str], None] = lambda _: None
    secret_value: Callable[[], str] | None = None
    created: list[tuple[str, str]] = field(default_factory=list)
    steps: list[Step] = field(default_factory=list)
    _uncertain: list[tuple[str, str]] = field(default_factory=list)
    _owner: dict[str, Any] | None = None
    _trainer_action: str = "create"  # create | keep | replace, decided before anything is written

    def apply_all(self, manifests: list[dict[str, Any]]) -> list[Step]:
        """Decide about the trainer, then apply in order; on any failure (or Ctrl-C) roll back what this run
        created, then re-raise."""
        trainer = next((m for m in manifests if m["kind"] in TRAINER_KINDS), None)
        if trainer is not None:
            self._trainer_action = self.decide_trainer(trainer)
        try:
            for manifest in manifests:
                self.steps.append(self.apply(manifest))
                if manifest["kind"] == OWNER_KIND and self._owner is None:
                    self._owner = self._owner_reference(manifest["metadata"]["name"])
        except BaseException:
            self.rollback()
            raise
        return self.steps

    def decide_trainer(self, manifest: dict[str, Any]) -> str:
        """create, keep or replace; raise (before any write) when a running trainer would have to change."""
        name = manifest["metadata"]["name"]
        want = manifest["metadata"]["annotations"][ANNOTATION_SPEC_HASH]
        action = "create"
        for kind in sorted(TRAINER_KINDS):
            current = self.res.read(kind, name)
            if current is None:
                continue
            self._check_ours(kind, name, current)
            if trainer_finished(current) is not None:
                action = "replace" if kind == manifest["kind"] else self._delete_finished(kind, name, action)
                continue
            have = ((current.get("metadata") or {}).get("annotations") or {}).get(ANNOTATION_SPEC_HASH)
            if kind == manifest["kind"] and have == want:
                action = "keep"
                continue
            raise ProvisionError(
                f"{kind}/{name} is running with a different spec; a running trainer is not changed in place, and "
                "nothing was changed",
                hint=f"`agl train stop {self.names.train} --keep-volumes` stops it and keeps its checkpoints; then "
                     "provision again (the trainer resumes from them)", exit_code=2)
        return action

    def _delete_finished(self, kind: str, name: str, action: str) -> str:
        """A finished trainer of the other kind (the train moved between one node and several) makes way."""
        self.res.delete(kind, name)
        self._wait_gone(kind, name)
        self.log(f"deleted the finished {kind}/{name}")
        return action

    def _owner_reference(self, name: str) -> dict[str, Any] | None:
        current = self.res.read(OWNER_KIND, name) or {}
        uid = (current.get("metadata") or {}).get("uid")
        if not uid:
            self.log(f"{OWNER_KIND}/{name} has no uid: the train's objects get no ownerReferences")
            return None
        return {"apiVersion": "v1", "kind": OWNER_KIND, "name": name, "uid": uid}

    def _check_ours(self, kind: str, name: str, current: dict[str, Any]) -> None:
        owner = ((current.get("metadata") or {}).get("labels") or {}).get(LABEL_TRAIN)
        if owner != self.names.train:
            raise ProvisionError(
                f"{kind}/{name} exists in namespace {self.res.namespace} and is not part of train "
                f"{self.names.train!r} ({'train ' + repr(owner) if owner else 'not made by agl'}); agl leaves it alone",
                hint="pick another name with --name, or another --namespace", exit_code=2)

    def apply(self, manifest: dict[str, Any]) -> Step:
        kind, name = manifest["kind"], manifest["metadata"]["name"]
        body = self._with_owner(self._with_secret(manifest))
        for attempt in range(self.attempts):
            outcome = self._try_create(kind, name, body, attempt)
            if outcome == "created":
                self.created.append((kind, name))
                self.log(f"created {kind}/{name}")
                return Step(kind, name, "created")
            if outcome == "exists":
                return self._existing(kind, name, body)
            time.sleep(self.backoff_s * 2**attempt)
        raise AssertionError("unreachable")

    def _with_owner(self, manifest: dict[str, Any]) -> dict[str, Any]:
        # The owner is the first ConfigMap (the project's); the others (the step rows) go with it.
        if (self._owner is None or manifest["kind"] in UNOWNED_KINDS
                or (manifest["kind"] == OWNER_KIND and manifest["metadata"]["name"] == self._owner["name"])):
            return manifest
        return {**manifest, "metadata": {**manifest["metadata"], "ownerReferences": [self._owner]}}

    def _with_secret(self, manifest: dict[str, Any]) -> dict[str, Any]:
        """The admin token goes in only now, into a copy: rendered manifests (and any printout) never hold it."""
        if manifest["kind"] != "Secret" or (manifest.get("stringData") or {}).get("token") != TOKEN_PLACEHOLDER:
            return manifest
        if self.secret_value is None:
            raise ProvisionError("internal: the admin token Secret needs a token generator")
        return {**manifest, "stringData": {"token": self.secret_value()}}

    def _try_create(self, kind: str, name: str, body: dict[str, Any], attempt: int) -> str:
        """'created', 'exists' (409, not ours from an earlier attempt), or 'retry'; raises when out of tries."""
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError

        try:
            self.res.create(body)
            return "created"
        except ApiException as exc:
            if exc.status == 409:
                if (kind, name) in self._uncertain and self._ours_from_this_run(kind, name):
                    self._uncertain.remove((kind, name))
                    return "created"  # an earlier, "failed" attempt was stored after all
                return "exists"
            if exc.status in RETRYABLE:
                self._uncertain.append((kind, name))
            if exc.status not in RETRYABLE or attempt == self.attempts - 1:
                raise ProvisionError(f"cannot create {kind}/{name} in namespace {self.res.namespace}: "
                                     f"{api_error(exc)}") from None
        except (HTTPError, OSError) as exc:
            self._uncertain.append((kind, name))
            if attempt == self.attempts - 1:
                raise ProvisionError(f"cannot create {kind}/{name}: the Kubernetes API did not answer ({exc})") from None
        return "retry"

    def _ours_from_this_run(self, kind: str, name: str) -> bool:
        existing = self.res.read(kind, name)
        annotations = ((existing or {}).get("metadata") or {}).get("annotations") or {}
        return annotations.get(ANNOTATION_PROVISION) == self.provision_id

    def _existing(self, kind: str, name: str, body: dict[str, Any]) -> Step:
        current = self.res.read(kind, name)
        if current is None:  # deleted between our create and our read: a plain retry settles it
            self.res.create(body)
            self.created.append((kind, name))
            return Step(kind, name, "created")
        self._check_ours(kind, name, current)
        if kind in KEPT_KINDS:
            self.log(f"kept {kind}/{name} (exists)")
            return Step(kind, name, "kept")
        if kind in TRAINER_KINDS:
            return self._existing_trainer(kind, name, body, current)
        from kubernetes.client.exceptions import ApiException

        try:
            self.res.patch(kind, name, body)
        except ApiException as exc:
            raise ProvisionError(f"cannot update {kind}/{name} in namespace {self.res.namespace}: {api_error(exc)}",
                                 hint=f"`agl train stop {self.names.train}` and provision again, if the change is "
                                      "to a field Kubernetes does not let change") from None
        self.log(f"patched {kind}/{name}")
        return Step(kind, name, "patched")

    def _existing_trainer(self, kind: str, name: str, body: dict[str, Any], current: dict[str, Any]) -> Step:
        if self._trainer_action == "keep" and trainer_finished(current) is None:
            self.log(f"kept {kind}/{name} (running, same spec)")
            return Step(kind, name, "kept")
        if trainer_finished(current) is None:  # started (or changed) since the decision: decide again, write nothing
            self.decide_trainer(body)
            return Step(kind, name, "kept")
        # A finished trainer holds nothing worth keeping (checkpoints live on their volume): start anew, resuming.
        self.res.delete(kind, name)
        self._wait_gone(kind, name)
        self.res.create(body)
        self.created.append((kind, name))
        self.log(f"replaced the finished {kind}/{name}")
        return Step(kind, name, "replaced")

    def _wait_gone(self, kind: str, name: str, timeout_s: float = 120.0) -> None:
        deadline = time.monotonic() + timeout_s
        while self.res.read(kind, name) is not None:
            if time.monotonic() > deadline:
                raise ProvisionError(f"{kind}/{name} is still being deleted after {timeout_s:g} s")
            time.sleep(0.5)

    def rollback(self) -> list[str]:
        """Delete what this run created, newest first; report (never raise) what could not be deleted."""
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError

        undone: list[str] = []
        for kind, name in [*self._uncertain_ours(), *reversed(self.created)]:
            try:
                if self.res.delete(kind, name):
                    undone.append(f"{kind}/{name}")
            except (ApiException, HTTPError, OSError) as exc:
                self.log(f"could not delete {kind}/{name} while rolling back: {exc}; `agl train stop` retries")
        if undone:
            self.log("rolled back: deleted " + ", ".join(undone))
        self.created.clear()
        return undone

    def _uncertain_ours(self) -> list[tuple[str, str]]:
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError

        ours = []
        for kind, name in dict.fromkeys(self._uncertain):
            try:
                if self._ours_from_this_run(kind, name):
                    ours.append((kind, name))
            except (ApiException, HTTPError, OSError):
                continue
        return ours


def delete_train(res: Resources, names: Names, *, keep_volumes: bool = False,
                 log: Callable[[str], None] = lambda _: None) -> list[str]:
    """Delete every object carrying the train's labels, trainer first, identity last. Rollout Jobs the
    controller left behind carry the label too (the cluster's agl.yaml adds it) and go with the trainer."""
    deleted: list[str] = []
    for kind in reversed(APPLY_ORDER):
        # The owner (the project's ConfigMap) last: deleting it first would have the garbage collector race us.
        for obj in sorted(res.objects(kind, names.selector()), key=lambda o: o["metadata"]["name"] == names.config):
            name = obj["metadata"]["name"]
            if obj["metadata"].get("deletionTimestamp"):
                continue
            if keep_volumes and kind == "PersistentVolumeClaim":
                log(f"kept {kind}/{name} (--keep-volumes)")
                continue
            if res.delete(kind, name):
                deleted.append(f"{kind}/{name}")
                log(f"deleted {kind}/{name}")
    return deleted
