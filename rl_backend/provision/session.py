"""The whole provision, start to end: plan, preflight, render and validate, apply, wait, follow; and `stop`.

`provision` is synchronous (the official client is blocking; a provision is a short sequence of calls and then a
poll). It takes an `api_client` so tests point it at an in-memory API server; otherwise the credentials are
loaded like kubectl's. A dry run never contacts a cluster.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import yaml
from rich.console import Console

from rl_backend.provision.apply import Applier, Step
from rl_backend.provision.bundle import RolloutSource, rollout_source
from rl_backend.provision.metrics import MetricsPrinter, follow
from rl_backend.provision.options import (
    ClusterOptions,
    Names,
    ProvisionError,
    ProvisionOptions,
    SecretRef,
    pinned,
    train_name,
)
from rl_backend.provision.plan import (
    DEFAULT_KUBERAY_NAMESPACE,
    KUBERAY_OPERATOR,
    RAYJOB_CRD,
    UID,
    Topology,
    choose_topology,
    default_images,
    template_context,
)
from rl_backend.provision.preflight import cluster_findings
from rl_backend.provision.render import Rendered, kind_name, render_all
from rl_backend.provision.resources import Resources, api_errors, load_api_client
from rl_backend.provision.stop import stop_train
from rl_backend.provision.target import TrainTarget, carried_files, key_refs, local_key_values, loopback_upstreams
from rl_backend.provision.wait import Waiter

DEFAULT_KUBERNETES_VERSION = "1.30"


@dataclass
class ProvisionResult:
    train: str
    namespace: str
    topology: Topology
    outcome: str  # dry-run | preflight | ready | interrupted | succeeded | failed
    manifests: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    steps: list[Step] = field(default_factory=list)
    detail: str = ""
    last_metrics: dict[str, Any] | None = None

    def summary(self) -> dict[str, Any]:
        return {
            "train": self.train, "namespace": self.namespace, "outcome": self.outcome, "detail": self.detail,
            "trainer": {"kind": "Job" if self.topology.kind == "job" else "RayJob", "nodes": self.topology.nodes,
                        "gpus_per_node": self.topology.gpus_per_node, "why": self.topology.why},
            "objects": [{"kind": s.kind, "name": s.name, "action": s.action} for s in self.steps]
            or [{"kind": m["kind"], "name": m["metadata"]["name"]} for m in self.manifests],
            "notes": self.notes, "last_metrics": self.last_metrics,
        }


def namespace_of(target: TrainTarget | None, cluster: ClusterOptions) -> str:
    if cluster.namespace:
        return cluster.namespace
    if target is not None and target.kubernetes is not None:
        return target.kubernetes.namespace
    return "default"


def _cluster_for(target: TrainTarget, options: ProvisionOptions) -> ClusterOptions:
    """--kubeconfig/--context, else agl.yaml's kubernetes section (relative to agl.yaml's folder)."""
    spec = target.kubernetes
    kubeconfig = options.kubeconfig
    if kubeconfig is None and spec is not None and spec.kubeconfig:
        kubeconfig = str((target.base_dir / spec.kubeconfig).expanduser())
    return ClusterOptions(options.namespace, kubeconfig, options.context or (spec.context if spec else None))


def rollout_plan(target: TrainTarget, options: ProvisionOptions) -> RolloutSource:
    runtime_image, _ = default_images()
    spec = target.kubernetes
    agent_image = options.agent_image or (spec.image if spec is not None else None)
    return rollout_source(target.base_dir, target.agent, target.grader, agent_image=agent_image,
                          runtime_image=options.gateway_image or runtime_image)


def _image_notes(images: dict[str, str]) -> list[str]:
    tagged = [f"{what} {image}" for what, image in images.items() if not pinned(image)]
    if not tagged:
        return []
    return ["images named by tag, not digest (" + "; ".join(tagged) + "): a tag pushed again changes what runs; "
            "pin each by digest (NAME@sha256:…) to run exactly that image"]


def render_train(target: TrainTarget, options: ProvisionOptions, rayjob_installed: bool | None,
                 provision_id: str) -> tuple[Names, str, Topology, list[SecretRef], Rendered]:
    options.check()
    names = Names(train_name(options.name or target.name))
    namespace = namespace_of(target, options)
    topology = choose_topology(options, rayjob_installed)
    refs = key_refs(target, options.key_secrets)
    spec = target.kubernetes
    source = rollout_plan(target, options)
    context = template_context(
        names=names, namespace=namespace, options=options, topology=topology, refs=refs,
        files=carried_files(target, names, namespace, options.include, source), provision_id=provision_id,
        image_pull_secrets=list(spec.image_pull_secrets) if spec else [], grader_image=source.image,
    )
    version = options.kubernetes_version or (spec.kubernetes_version if spec else DEFAULT_KUBERNETES_VERSION)
    rendered = render_all(context, withheld=local_key_values(refs), kubernetes_version=version,
                          rollout_policy=spec.network_policy if spec else None, base_dir=target.base_dir)
    rendered.notes += source.notes
    for name in [n for n, u in target.upstreams.items() if u.kind == "embedded"]:
        rendered.notes.append(f"upstream {name!r} is embedded: in the cluster it is the policy being trained, served "
                              "by the trainer's policy servers (vLLM on its GPUs), which it registers with the gateway")
    for upstream in loopback_upstreams(target):
        rendered.notes.append(f"upstream {upstream} names a loopback address, which in the cluster is the gateway's "
                              "own pod: point it at a Service or a reachable host")
    rendered.notes += _image_notes({"trainer": context["trainer_image"], "gateway": context["gateway_image"],
                                    "rollout": source.image})
    rendered.notes.insert(0, f"trainer: {'Job' if topology.kind == 'job' else 'RayJob'} on {topology.nodes} node(s) "
                             f"x {topology.gpus_per_node} GPU(s) ({topology.why})")
    return names, namespace, topology, refs, rendered


def dry_run(target: TrainTarget, options: ProvisionOptions) -> ProvisionResult:
    names, namespace, topology, _, rendered = render_train(target, options, None, "dry-run")
    rendered.notes.append(f"when applied, every object but the volumes gets an ownerReference to ConfigMap/"
                          f"{names.config} (its uid exists only then): deleting it deletes the train")
    return ProvisionResult(names.train, namespace, topology, "dry-run", rendered.manifests, rendered.notes)


def manifests_yaml(manifests: list[dict[str, Any]], notes: dict[str, str] | None = None) -> str:
    """YAML documents (`---` separated), multi-line strings as literal blocks; a comment heads each."""

    class _Dumper(yaml.SafeDumper):
        pass

    def _str(dumper: yaml.SafeDumper, value: str) -> yaml.Node:
        style = "|" if "\n" in value and not any(c in value for c in "\t\r") else None
        return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)

    _Dumper.add_representer(str, _str)
    docs = []
    for manifest in manifests:
        header = f"# {kind_name(manifest)}"
        if notes and manifest.get("kind") in notes:
            header += f"\n# {notes[manifest['kind']]}"
        docs.append(header + "\n" + yaml.dump(manifest, Dumper=_Dumper, sort_keys=False, allow_unicode=True))
    return "---\n".join(docs)


def preflight_secrets(res: Resources, refs: list[SecretRef], log: Callable[[str], None]) -> None:
    """Every Secret and key the gateway reads exists, checked before anything is created (a missing one would
    otherwise surface as CreateContainerConfigError minutes later). Values are read by the client, never kept."""
    from kubernetes.client.exceptions import ApiException

    for secret in sorted({r.secret for r in refs}):
        try:
            keys = res.secret_keys(secret)
        except ApiException as exc:
            if exc.status not in (401, 403):
                raise
            log(f"cannot check Secret {secret} (no permission to read Secrets); the gateway pod will tell")
            continue
        if keys is None:
            wanted = [r for r in refs if r.secret == secret]
            raise ProvisionError(
                f"Secret {secret} does not exist in namespace {res.namespace}; the gateway reads "
                + ", ".join(f"{r.env} from its key {r.key!r}" for r in wanted),
                hint=f"kubectl -n {res.namespace} create secret generic {secret} "
                     + " ".join(f"--from-literal={r.key}=…" for r in wanted)
                     + "   (or map another Secret: --key-secret ENV=SECRET:KEY)", exit_code=2)
        missing = [r for r in refs if r.secret == secret and r.key not in keys]
        if missing:
            raise ProvisionError(
                f"Secret {secret} has no key " + ", ".join(repr(r.key) for r in missing)
                + " (for " + ", ".join(r.env for r in missing) + ")",
                hint="add the key to the Secret, or point at another with --key-secret ENV=SECRET:KEY", exit_code=2)


def provision(target: TrainTarget, options: ProvisionOptions, *, console: Console, out: Console,
              api_client: Any = None, token: Callable[[], str] = lambda: secrets.token_urlsafe(32),
              sleep: Callable[[float], None] = time.sleep) -> ProvisionResult:
    """Apply the train and wait for it; then follow its metrics unless `options.follow` is off."""
    if options.dry_run:
        return dry_run(target, options)
    options.check()
    log: Callable[[str], None] = lambda text: console.print(text, markup=False, highlight=False)  # noqa: E731
    client = api_client if api_client is not None else load_api_client(_cluster_for(target, options))
    res = Resources(client, namespace_of(target, options))
    try:
        with api_errors(f"provisioning in namespace {res.namespace}"):
            return _provision(res, target, options, console=console, out=out, token=token, sleep=sleep, log=log)
    finally:
        if api_client is None:
            res.close()


def _provision(res: Resources, target: TrainTarget, options: ProvisionOptions, *, console: Console, out: Console,
               token: Callable[[], str], sleep: Callable[[float], None],
               log: Callable[[str], None]) -> ProvisionResult:
    wanted = choose_topology(options, None)
    installed = res.crd_installed(RAYJOB_CRD) if wanted.kind == "rayjob" else False
    if installed is None:
        log("cannot tell whether KubeRay is installed (no permission to read CRDs); assuming it is")
        installed = True
    if wanted.kind == "rayjob" and installed:
        options.kuberay_namespace = _kuberay_namespace(res, options, log)
    provision_id = secrets.token_hex(6)
    names, namespace, topology, refs, rendered = render_train(target, options, installed, provision_id)
    for note in rendered.notes:
        log(note)
    preflight_secrets(res, refs, log)
    findings = cluster_findings(res, rendered.manifests, store_claim=names.store_pvc, uid=UID)
    for finding in findings:
        log(f"{finding.level}: {finding.text}" + (f"\n  hint: {finding.hint}" if finding.hint else ""))
    errors = [f for f in findings if f.level == "error"]
    if errors:
        raise ProvisionError("this train would not start; nothing was applied:\n" + "\n".join(
            f"- {f.text}" + (f"\n  hint: {f.hint}" if f.hint else "") for f in errors), exit_code=2)
    if options.preflight:
        result = ProvisionResult(names.train, namespace, topology, "preflight", rendered.manifests, rendered.notes)
        result.detail = f"{len(findings)} warning(s); nothing was applied (--preflight)"
        return result
    applier = Applier(res, names, provision_id, attempts=options.create_attempts, backoff_s=options.retry_backoff_s,
                      log=log, secret_value=token)
    steps = applier.apply_all(rendered.manifests)
    result = ProvisionResult(names.train, namespace, topology, "ready", steps=steps, notes=rendered.notes)
    waiter = Waiter(res, names, topology, console, timeout_s=options.timeout_s, poll_s=options.poll_s, sleep=sleep)
    try:
        with api_errors("waiting for the train to come up"):  # an API error here fails (and rolls back) like any
            waiter.wait()
    except ProvisionError as exc:
        if options.keep_on_failure:
            exc.message += "\n(left in place for inspection: --keep-on-failure; `agl train stop` removes it)"
        elif applier.rollback():
            exc.message += "\n(rolled back: the objects this run created were deleted)"
        raise
    except KeyboardInterrupt:  # the user stopped waiting, not the train: it stays, and says how to find it
        result.outcome = "interrupted"
        return result
    log(f"train {names.train} is up in namespace {namespace}: gateway {names.gateway_url(namespace)}")
    if not options.follow:
        return result
    printer = MetricsPrinter(out, json_output=options.json_output)
    try:
        outcome, detail = follow(res, names, topology, printer, poll_s=options.poll_s, sleep=sleep, note=log)
    except KeyboardInterrupt:
        result.outcome, result.last_metrics = "interrupted", printer.last
        return result
    result.outcome, result.detail, result.last_metrics = outcome, detail, printer.last
    if outcome == "failed":
        failed = next((c for c in _checks_quietly(waiter) if c.failure), None)
        explained = waiter.explain(failed) if failed is not None else ""
        raise ProvisionError(f"the trainer failed: {detail}" + (f"\n{explained}" if explained else ""),
                             hint=f"`agl train status {names.train}`; the objects stay until `agl train stop`")
    return result


def _kuberay_namespace(res: Resources, options: ProvisionOptions, log: Callable[[str], None]) -> str:
    """Where the KubeRay operator runs: the Ray dashboard's policy admits the operator from that namespace only."""
    if options.kuberay_namespace:
        return options.kuberay_namespace
    found = res.operator_namespaces(KUBERAY_OPERATOR)
    if found is None:
        log(f"cannot list Deployments cluster-wide to find the KubeRay operator; assuming namespace "
            f"{DEFAULT_KUBERAY_NAMESPACE} (give --kuberay-namespace if it runs elsewhere)")
        return DEFAULT_KUBERAY_NAMESPACE
    if len(found) != 1:
        where = "no namespace" if not found else "namespaces " + ", ".join(found)
        raise ProvisionError(f"the KubeRay operator (a Deployment labelled app.kubernetes.io/name=kuberay-operator) "
                             f"runs in {where}; its namespace is the one the Ray dashboard admits it from",
                             hint="give --kuberay-namespace NAMESPACE", exit_code=2)
    return found[0]


def _checks_quietly(waiter: Waiter) -> list[Any]:
    from rl_backend.provision.wait import gather

    try:
        return gather(waiter.res, waiter.names, waiter.topology)
    except Exception:  # noqa: BLE001 - only to enrich an error already being reported
        return []


def stop(train: str, cluster: ClusterOptions, *, keep_volumes: bool = False, api_client: Any = None,
         log: Callable[[str], None] = lambda _: None) -> list[str]:
    """Delete every object of the train (by its label) in the namespace; return what was deleted."""
    names = Names(train_name(train))
    res = Resources(api_client if api_client is not None else load_api_client(cluster), namespace_of(None, cluster))
    try:
        with api_errors(f"deleting train {names.train} in namespace {res.namespace}"):
            return stop_train(res, names, keep_volumes=keep_volumes, log=log)
    finally:
        if api_client is None:
            res.close()
