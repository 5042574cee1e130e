"""`agl train CONFIG --on kubernetes`, `agl train status`, `agl train stop`: the RL backend on a cluster.

The work is in rl_backend.provision; this module is the command line around it: flags to ProvisionOptions,
agl.yaml to a TrainTarget, output (progress on stderr; manifests, metrics rows and JSON on stdout), and errors to
exit codes. Three entry points for `agl train` (see `register`): `provision`, `status`, `stop`.

Nothing here imports `kubernetes` (or rich's live display) at module level: `agl --help` stays fast without the
`k8s` extra.
"""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Optional

import typer

from agl_cli.cli_support import handle_errors
from agl_cli.commands.train_group import TrainGroup  # noqa: F401 - `agl train`'s group, long defined here

if TYPE_CHECKING:
    from agl_cli.spec.schema import ExperimentSpec
    from rl_backend.provision.options import ClusterOptions, ProvisionOptions
    from rl_backend.provision.session import ProvisionResult
    from rl_backend.provision.target import TrainTarget


class TrainerChoice(str, Enum):
    auto = "auto"
    job = "job"
    rayjob = "rayjob"


# -- the library API (what `agl train` calls) ------------------------------------------------------------------------


def _agl_error(exc: Any) -> Exception:
    from agl_cli.errors import AglError

    error = AglError(exc.message, hint=exc.hint)
    error.exit_code = exc.exit_code
    return error


def target_from_spec(spec: ExperimentSpec, config: Path | None = None) -> TrainTarget:
    """What a provision needs from a loaded agl.yaml: its upstreams, kubernetes section, and the files it names."""
    from rl_backend.provision.bundle import Program
    from rl_backend.provision.target import TrainTarget

    files = [spec.tasks.path] + [f for knob in spec.knobs.values() for f in knob.option_files()]
    path = config if config is not None else spec.base_dir / "agl.yaml"
    if path.is_dir():
        path = path / "agl.yaml"
    return TrainTarget(spec.name, path, dict(spec.upstreams), spec.kubernetes, files,
                       agent=Program("agent", spec.agent.command, spec.agent.entry),
                       grader=Program("grader", spec.grader.command, spec.grader.entry))


def provision(spec: ExperimentSpec, options: ProvisionOptions, *, config: Path | None = None,
              api_client: Any = None) -> ProvisionResult:
    """Provision the train, wait until it is up, then (unless `options.follow` is off) print its step metrics until
    it ends. Prints progress to stderr and data to stdout; raises AglError (exit 1 or 2) on failure."""
    from agl_cli.console import print_json, stderr_console, stdout_console
    from rl_backend.provision.options import ProvisionError
    from rl_backend.provision.session import manifests_yaml
    from rl_backend.provision.session import provision as run_provision

    console, out = stderr_console(), stdout_console()
    target = target_from_spec(spec, config)
    try:
        result = run_provision(target, options, console=console, out=out, api_client=api_client)
    except ProvisionError as exc:
        raise _agl_error(exc) from None
    except KeyboardInterrupt:
        console.print("interrupted: what this run had created was rolled back (objects that existed before stay)")
        raise typer.Exit(130) from None
    if result.outcome == "dry-run":
        for note in result.notes:
            console.print(f"note: {note}", markup=False, highlight=False)
        if options.json_output:
            print_json({**result.summary(), "manifests": result.manifests})
        else:
            import sys

            from rl_backend.provision.render import rayjob_note

            sys.stdout.write(manifests_yaml(result.manifests, {"RayJob": rayjob_note()}))
            sys.stdout.flush()
        console.print(f"{len(result.manifests)} manifests rendered and validated; nothing was applied (--dry-run)")
        return result
    if result.outcome == "preflight":
        if options.json_output:
            print_json({**result.summary(), "manifests": result.manifests})
        console.print(f"preflight: {result.detail}", markup=False, highlight=False)
        return result
    if options.json_output and options.follow:
        import json
        import sys

        # JSON Lines: the metrics rows came first, one per line; the summary (with "outcome") is the last line.
        sys.stdout.write(json.dumps(result.summary(), default=str) + "\n")
        sys.stdout.flush()
    elif options.json_output:
        print_json(result.summary())
    else:
        _print_outcome(console, result)
    return result


def _print_outcome(console: Any, result: ProvisionResult) -> None:
    hint = f"`agl train status {result.train} -n {result.namespace}`, `agl train stop {result.train} -n {result.namespace}`"
    if result.outcome == "ready":
        console.print(f"train {result.train} is running; follow it with {hint}", markup=False, highlight=False)
    elif result.outcome == "interrupted":
        console.print(f"stopped following; train {result.train} keeps running: {hint}", markup=False, highlight=False)
    else:
        metrics = f"; last metrics: {result.last_metrics}" if result.last_metrics else ""
        console.print(f"trainer {result.outcome}{metrics}", markup=False, highlight=False)


def _cluster(name_or_config: str | None, namespace: str | None, kubeconfig: str | None,
             context: str | None) -> tuple[str | None, ClusterOptions]:
    """A train name, or agl.yaml (a file or its folder) to take the name and namespace from."""
    from rl_backend.provision.options import ClusterOptions

    name = name_or_config
    if name_or_config is not None and Path(name_or_config).exists():
        from agl_cli.spec.schema import load_spec

        spec = load_spec(Path(name_or_config))
        name = spec.name
        if namespace is None and spec.kubernetes is not None:
            namespace = spec.kubernetes.namespace
        if kubeconfig is None and spec.kubernetes is not None and spec.kubernetes.kubeconfig:
            kubeconfig = str((spec.base_dir / spec.kubernetes.kubeconfig).expanduser())
    return name, ClusterOptions(namespace, kubeconfig, context)


def status(name: str | None, cluster: ClusterOptions, *, api_client: Any = None) -> dict[str, Any]:
    """The train's status document (see rl_backend.provision.status); with no name, the one train in the
    namespace, else a document listing them."""
    from rl_backend.provision.options import Names, ProvisionError, train_name
    from rl_backend.provision.resources import Resources, api_errors, load_api_client
    from rl_backend.provision.session import namespace_of
    from rl_backend.provision.status import list_trains, train_status

    try:
        res = Resources(api_client if api_client is not None else load_api_client(cluster), namespace_of(None, cluster))
    except ProvisionError as exc:
        raise _agl_error(exc) from None
    try:
        with api_errors(f"reading trains in namespace {res.namespace}"):
            if name is None:
                trains = list_trains(res)
                if len(trains) != 1:
                    return {"namespace": res.namespace, "trains": trains}
                name = trains[0]
            return train_status(res, Names(train_name(name)))
    except ProvisionError as exc:
        raise _agl_error(exc) from None
    finally:
        if api_client is None:
            res.close()


def stop(name: str, cluster: ClusterOptions, *, keep_volumes: bool = False, api_client: Any = None) -> list[str]:
    """Delete the train's objects (found by its label); returns `Kind/name` of each deleted."""
    from agl_cli.console import stderr_console
    from rl_backend.provision.options import ProvisionError
    from rl_backend.provision.session import stop as run_stop

    console = stderr_console()
    try:
        return run_stop(name, cluster, keep_volumes=keep_volumes, api_client=api_client,
                        log=lambda text: console.print(text, markup=False, highlight=False))
    except ProvisionError as exc:
        raise _agl_error(exc) from None


# -- the command line ------------------------------------------------------------------------------------------------


NamespaceOpt = Annotated[Optional[str], typer.Option("--namespace", "-n", help="Namespace (default: agl.yaml's kubernetes.namespace, else default).")]  # noqa: UP045,E501
KubeconfigOpt = Annotated[Optional[str], typer.Option(help="kubeconfig file (default: $KUBECONFIG, ~/.kube/config, in-cluster).")]  # noqa: UP045,E501
ContextOpt = Annotated[Optional[str], typer.Option(help="kubeconfig context.")]  # noqa: UP045
JsonOpt = Annotated[bool, typer.Option("--json", help="JSON on stdout (progress stays on stderr).")]


@handle_errors
def k8s_command(
    config: Annotated[Path, typer.Argument(help="agl.yaml (or its folder).")],
    on: Annotated[str, typer.Option("--on", help="Where to train: kubernetes.")] = "kubernetes",
    namespace: NamespaceOpt = None,
    gpus: Annotated[int, typer.Option(help="GPUs for the trainer (K > 8 spans nodes, via KubeRay).")] = 1,
    nodes: Annotated[Optional[int], typer.Option(help="Nodes to spread the GPUs over (default ceil(K/8)).")] = None,  # noqa: UP045
    image: Annotated[Optional[str], typer.Option(help="Trainer image (verl + vLLM + agl); see docker/README.md. Pin it by digest: NAME@sha256:….")] = None,  # noqa: UP045,E501
    gateway_image: Annotated[Optional[str], typer.Option(help="Gateway image (default: agl-runtime at agl's version); rollouts run it when no agent image is given.")] = None,  # noqa: UP045,E501
    agent_image: Annotated[Optional[str], typer.Option(help="The agent's image: rollouts run it (default: kubernetes.image in agl.yaml, else the gateway image with the project's files).")] = None,  # noqa: UP045,E501
    trainer: Annotated[TrainerChoice, typer.Option(help="auto: a Job on one node, a KubeRay RayJob on several.")] = TrainerChoice.auto,  # noqa: E501
    name: Annotated[Optional[str], typer.Option(help="The train's name (default: agl.yaml's name).")] = None,  # noqa: UP045
    key_secret: Annotated[Optional[list[str]], typer.Option("--key-secret", help="ENV=SECRET[:KEY]: where the gateway reads an upstream key (default: key ENV of Secret agl-upstream-keys); repeat.")] = None,  # noqa: UP045,E501
    include: Annotated[Optional[list[str]], typer.Option("--include", help="Also ship this file or folder (relative to agl.yaml), e.g. the grader; repeat.")] = None,  # noqa: UP045,E501
    checkpoint_size: Annotated[str, typer.Option(help="Size of the checkpoint volume.")] = "200Gi",
    store_size: Annotated[str, typer.Option(help="Size of the gateway's store volume.")] = "10Gi",
    storage_class: Annotated[Optional[str], typer.Option(help="StorageClass of both volumes (a RayJob trainer needs one that offers ReadWriteMany).")] = None,  # noqa: UP045,E501
    store_storage_class: Annotated[Optional[str], typer.Option(help="StorageClass of the gateway's SQLite store: a block class, never NFS (default: the cluster's default).")] = None,  # noqa: UP045,E501
    trainer_cpu: Annotated[Optional[str], typer.Option(help="CPU request of each pod holding GPUs (default 4 per GPU).")] = None,  # noqa: UP045,E501
    trainer_memory: Annotated[Optional[str], typer.Option(help="Memory request of each pod holding GPUs (default 24Gi per GPU).")] = None,  # noqa: UP045,E501
    node_selector: Annotated[Optional[list[str]], typer.Option("--node-selector", help="KEY=VALUE: a label the GPU nodes carry (GKE Autopilot: cloud.google.com/gke-accelerator=nvidia-l4); repeat.")] = None,  # noqa: UP045,E501
    toleration: Annotated[Optional[list[str]], typer.Option("--toleration", help="KEY[=VALUE][:EFFECT]: a taint of the GPU nodes the trainer tolerates; repeat.")] = None,  # noqa: UP045,E501
    preflight: Annotated[bool, typer.Option("--preflight", help="Read the cluster (nodes, StorageClasses, CNI, KubeRay, Secrets) and say what would not start; apply nothing.")] = False,  # noqa: E501
    kuberay_namespace: Annotated[Optional[str], typer.Option(help="Namespace of the KubeRay operator, which alone may reach the Ray dashboard (default: found in the cluster).")] = None,  # noqa: UP045,E501
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Print every manifest (validated) and apply nothing.")] = False,  # noqa: E501
    detach: Annotated[bool, typer.Option("--detach", help="Return once the train is up instead of following its metrics.")] = False,  # noqa: E501
    keep_on_failure: Annotated[bool, typer.Option("--keep-on-failure", help="Leave a train that failed to start in place, to inspect it.")] = False,  # noqa: E501
    timeout: Annotated[float, typer.Option(help="Seconds to wait for the train to come up.")] = 1800.0,
    steps: Annotated[Optional[int], typer.Option(help="Trainer: policy updates to make in all.", rich_help_panel="Training")] = None,  # noqa: UP045,E501
    tasks_per_step: Annotated[Optional[int], typer.Option(help="Trainer: training tasks per update.", rich_help_panel="Training")] = None,  # noqa: UP045,E501
    group_size: Annotated[Optional[int], typer.Option(help="Trainer: rollouts per task per update (the GRPO group).", rich_help_panel="Training")] = None,  # noqa: UP045,E501
    lr: Annotated[Optional[float], typer.Option(help="Trainer: learning rate.", rich_help_panel="Training")] = None,  # noqa: UP045,E501
    temperature: Annotated[Optional[float], typer.Option(help="Trainer: sampling temperature of training rollouts; the cluster's verl trainer takes only 1 (it records and recomputes logprobs at temperature 1).", rich_help_panel="Training")] = None,  # noqa: UP045,E501
    lora: Annotated[Optional[bool], typer.Option("--lora/--no-lora", help="Trainer: a LoRA adapter, or all weights.", rich_help_panel="Training")] = None,  # noqa: UP045,E501
    lora_rank: Annotated[Optional[int], typer.Option(help="Trainer: LoRA rank (any; merged into the weights vLLM serves).", rich_help_panel="Training")] = None,  # noqa: UP045,E501
    loss_agg: Annotated[Optional[str], typer.Option(help="Trainer: rollout, token-mean or seq-mean-token-mean.", rich_help_panel="Training")] = None,  # noqa: UP045,E501
    kl_coef: Annotated[Optional[float], typer.Option(help="Trainer: weight of the KL penalty to the starting model.", rich_help_panel="Training")] = None,  # noqa: UP045,E501
    loop: Annotated[Optional[str], typer.Option(help="Trainer: sync or collocated-async.", rich_help_panel="Training")] = None,  # noqa: UP045,E501
    heldout_limit: Annotated[Optional[int], typer.Option(help="Trainer: held-out tasks evaluated before and after.", rich_help_panel="Training")] = None,  # noqa: UP045,E501
    heldout_split: Annotated[Optional[str], typer.Option(help="Trainer: the split judged on.", rich_help_panel="Training")] = None,  # noqa: UP045,E501
    train_split: Annotated[Optional[str], typer.Option(help="Trainer: the split trained on.", rich_help_panel="Training")] = None,  # noqa: UP045,E501
    max_prompt_length: Annotated[Optional[int], typer.Option(help="Trainer: longest prompt in tokens the policy servers take (default: the trained upstream's max_prompt_length, else 4096).", rich_help_panel="Training")] = None,  # noqa: UP045,E501
    max_response_length: Annotated[Optional[int], typer.Option(help="Trainer: most tokens in one answer (default: the trained upstream's max_response_length, else 2048); with the prompt's, within the model's max_position_embeddings.", rich_help_panel="Training")] = None,  # noqa: UP045,E501
    tool_call_parser: Annotated[Optional[str], typer.Option(help="Trainer: vLLM's tool-call parser for agents that send `tools` (hermes, llama3_json, mistral, ...; none: no tool calls). Default: the upstream's `tool_call_parser`, else the model family's.", rich_help_panel="Training")] = None,  # noqa: UP045,E501
    rollout_dtype: Annotated[Optional[str], typer.Option(help="Trainer: what vLLM computes in: bfloat16, float16 or float32 (default: bfloat16 on GPUs).", rich_help_panel="Training")] = None,  # noqa: UP045,E501
    kubeconfig: KubeconfigOpt = None,
    context: ContextOpt = None,
    json_output: JsonOpt = False,
) -> None:
    """Provision the RL backend on Kubernetes (gateway, RBAC, trainer) and follow the trainer's step metrics.
    Training flags are passed to the trainer (`agl train CONFIG --backend verl`); unset ones keep its defaults."""
    from agl_cli.errors import UsageError
    from agl_cli.spec.schema import load_spec
    from rl_backend.provision.options import (
        ProvisionError,
        ProvisionOptions,
        parse_node_selector,
        parse_secret_ref,
        parse_toleration,
    )
    from rl_backend.provision.trainer_args import TrainerArgs

    if on != "kubernetes":
        raise UsageError(f"--on {on!r}: this command provisions on kubernetes; leave out --on to train locally")
    try:
        refs = [parse_secret_ref(text) for text in key_secret or []]
        selector = parse_node_selector(node_selector or [])
        tolerations = [parse_toleration(text) for text in toleration or []]
    except ProvisionError as exc:
        raise _agl_error(exc) from None
    spec = load_spec(config)
    options = ProvisionOptions(
        namespace=namespace, kubeconfig=kubeconfig, context=context, name=name, gpus=gpus, nodes=nodes, image=image,
        gateway_image=gateway_image, agent_image=agent_image, trainer=trainer.value, key_secrets=refs,
        trainer_args=TrainerArgs(steps=steps, tasks_per_step=tasks_per_step, group_size=group_size, lr=lr,
                                 temperature=temperature, lora=lora, lora_rank=lora_rank, loss_agg=loss_agg,
                                 kl_coef=kl_coef, loop=loop, heldout_limit=heldout_limit, heldout_split=heldout_split,
                                 train_split=train_split, max_prompt_length=max_prompt_length,
                                 max_response_length=max_response_length, tool_call_parser=tool_call_parser,
                                 rollout_dtype=rollout_dtype),
        include=list(include or []),
        checkpoint_size=checkpoint_size, store_size=store_size, storage_class=storage_class,
        kuberay_namespace=kuberay_namespace, store_storage_class=store_storage_class, trainer_cpu=trainer_cpu,
        trainer_memory=trainer_memory, node_selector=selector, tolerations=tolerations, preflight=preflight,
        dry_run=dry_run,
        follow=not detach, keep_on_failure=keep_on_failure, json_output=json_output, timeout_s=timeout,
    )
    result = provision(spec, options, config=config)
    if result.outcome == "failed":
        raise typer.Exit(1)


@handle_errors
def status_command(
    train: Annotated[Optional[str], typer.Argument(help="The train's name, or its agl.yaml (default: the namespace's only train).")] = None,  # noqa: UP045,E501
    namespace: NamespaceOpt = None,
    kubeconfig: KubeconfigOpt = None,
    context: ContextOpt = None,
    json_output: JsonOpt = False,
) -> None:
    """A train on the cluster: its objects, whether it is up, its last step metrics."""
    from agl_cli.console import print_json, stdout_console

    name, cluster = _cluster(train, namespace, kubeconfig, context)
    document = status(name, cluster)
    if json_output:
        print_json(document)
        return
    out = stdout_console()
    if "trains" in document:
        trains = document["trains"]
        out.print(f"trains in namespace {document['namespace']}: " + (", ".join(trains) if trains else "none"),
                  markup=False)
        return
    out.print(f"train {document['train']} (namespace {document['namespace']}): {document['phase']}", markup=False)
    for check in document["checks"]:
        out.print(f"  {check['state']:>7}  {check['label']}: {check['detail']}", markup=False, highlight=False)
    for obj in document["objects"]:
        out.print(f"  {obj['kind']}/{obj['name']}", markup=False, highlight=False)
    if document["last_metrics"] is not None:
        out.print(f"  last metrics: {document['last_metrics']}", markup=False, highlight=False)
    if document["phase"] == "not found":
        raise typer.Exit(1)


@handle_errors
def stop_command(
    train: Annotated[str, typer.Argument(help="The train's name, or its agl.yaml.")],
    keep_volumes: Annotated[bool, typer.Option("--keep-volumes", help="Keep the checkpoint and store volumes (a later provision resumes from them).")] = False,  # noqa: E501
    namespace: NamespaceOpt = None,
    kubeconfig: KubeconfigOpt = None,
    context: ContextOpt = None,
    json_output: JsonOpt = False,
) -> None:
    """Delete everything a train created (found by its label), trainer first."""
    from agl_cli.console import print_json, stderr_console

    name, cluster = _cluster(train, namespace, kubeconfig, context)
    assert name is not None
    deleted = stop(name, cluster, keep_volumes=keep_volumes)
    if json_output:
        print_json({"train": name, "deleted": deleted})
    else:
        stderr_console().print(f"deleted {len(deleted)} objects of train {name}" if deleted
                               else f"nothing of train {name} was found", markup=False)


def register(train_app: typer.Typer) -> None:
    """Add `k8s` (hidden: `agl train CONFIG --on kubernetes` lands there), `status` and `stop` to `agl train`."""
    train_app.command("k8s", hidden=True)(k8s_command)
    from agl_cli.commands.train_verl import verl_command

    train_app.command("verl", hidden=True)(verl_command)
    train_app.command("status")(status_command)
    train_app.command("stop")(stop_command)
