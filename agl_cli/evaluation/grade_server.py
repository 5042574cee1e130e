"""`python -m agl_cli.evaluation.grade_server DIR --project PROJECT`: the grader container of a cluster train.

Runs in the trainer's pod beside the controller, under a uid of its own, with no ServiceAccount token and no
credential in its environment or volumes (templates/k8s/provision/_trainer_pod.yaml.j2). It takes each request the
controller puts in DIR/requests (agl_cli/evaluation/grade_channel.py), runs the grader command there — a `command:`
grader, or `python -m agl_cli.evaluation.grade_entry` for an `entry:` one — in PROJECT with this container's own
environment, in a folder of its own holding copies of the task and the agent's output, kills it at its timeout, and
answers with its exit code and output tails. Requests run concurrently, as the controller sends them.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shlex
import shutil
import signal
import sys
from pathlib import Path
from typing import Any

from agl_cli.evaluation.grade_channel import POLL_S, read_bounded, write_atomic
from agl_cli.spec.command_template import fill
from rl_backend.rollout.base import RolloutJob
from rl_backend.rollout.local import LocalController

TAIL_BYTES = 256 * 1024  # what agl keeps of a grader's output locally (agl_cli/evaluation/grading.py)


class GradeServer:
    def __init__(self, root: Path, project: Path) -> None:
        self.root = root
        self.project = project
        self.requests = root / "requests"
        self.answers = root / "answers"
        self.work = root / "work"
        self.controller = LocalController(tail_bytes=TAIL_BYTES)
        self.running: dict[str, asyncio.Task[None]] = {}

    def prepare(self) -> None:
        for folder in (self.answers, self.work):
            folder.mkdir(mode=0o755, exist_ok=True)

    async def serve(self, stop: asyncio.Event) -> None:
        self.prepare()
        print(f"grade server: serving {self.root} (uid {os.getuid()}), graders run in {self.project}",
              file=sys.stderr, flush=True)
        while not stop.is_set():
            self.poll()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), POLL_S)
        for task in self.running.values():
            task.cancel()
        await asyncio.gather(*self.running.values(), return_exceptions=True)
        await self.controller.close()

    def poll(self) -> None:
        pending = {p.name[: -len(".json")] for p in _listing(self.requests) if _is_request(p.name)}
        for request_id in pending - self.running.keys():
            if (self.answers / f"{request_id}.taken").exists():
                continue  # answered before a restart of this container; the controller has yet to collect it
            self.running[request_id] = asyncio.create_task(self._handle(request_id))
        # The controller collected it (or gave up): stop a grader still running, forget the answer.
        for request_id in list(self.running):
            if request_id not in pending:
                self.running.pop(request_id).cancel()
        for answer in _listing(self.answers):
            request_id = answer.name.split(".", 1)[0]
            if not answer.name.startswith(".") and request_id not in pending and request_id not in self.running:
                with contextlib.suppress(FileNotFoundError):
                    answer.unlink()
                shutil.rmtree(self.work / request_id, ignore_errors=True)

    async def _handle(self, request_id: str) -> None:
        write_atomic(self.answers / f"{request_id}.taken", b"")
        try:
            answer = await self._grade(request_id)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a malformed request, a full disk: answered, so the controller is not left waiting
            answer = {"exit_code": 125, "timed_out": False, "stdout_tail": "",
                      "stderr_tail": f"the grader container could not run this request: {exc}"}
        finally:
            shutil.rmtree(self.work / request_id, ignore_errors=True)
        write_atomic(self.answers / f"{request_id}.json", json.dumps(answer).encode())

    async def _grade(self, request_id: str) -> dict[str, Any]:
        request = json.loads(read_bounded(self.requests / f"{request_id}.json") or b"null")
        folder = self.work / request_id
        folder.mkdir(mode=0o700)
        task_file, output_file = folder / "task.json", folder / "output"
        for source, target in ((f"{request_id}.task.json", task_file), (f"{request_id}.output", output_file)):
            target.write_bytes(read_bounded(self.requests / source, limit=None) or b"")
        line = fill(str(request["command"]), {
            "task_file": shlex.quote(str(task_file)),
            "output_file": shlex.quote(str(output_file)),
            "rollout_dir": shlex.quote(str(folder)),
            "python": shlex.quote(sys.executable),
        })
        job = RolloutJob(rollout_id=str(request.get("rollout_id", request_id)), command=line, env=dict(os.environ),
                         cwd=self.project, rollout_dir=folder, timeout_s=float(request["timeout_s"]))
        result = await self.controller.run(job)
        return {"exit_code": result.exit_code, "timed_out": result.timed_out,
                "stdout_tail": result.stdout_tail, "stderr_tail": result.stderr_tail}


def _listing(folder: Path) -> list[Path]:
    try:
        return list(folder.iterdir())
    except FileNotFoundError:
        return []


def _is_request(name: str) -> bool:
    return name.endswith(".json") and not name.endswith(".task.json") and not name.startswith(".")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m agl_cli.evaluation.grade_server",
                                     description="Serve grading requests from a cluster trainer's controller.")
    parser.add_argument("dir", type=Path, help="the folder shared with the controller ($AGL_GRADER_DIR)")
    parser.add_argument("--project", type=Path, required=True, help="the project's folder: graders run there")
    args = parser.parse_args(argv)
    if not args.project.is_dir():
        print(f"grade server: --project {args.project} is not a folder", file=sys.stderr)
        return 2
    if not args.dir.is_dir():
        print(f"grade server: {args.dir} is not a folder (the emptyDir shared with the controller)", file=sys.stderr)
        return 2
    return asyncio.run(_serve(GradeServer(args.dir, args.project)))


async def _serve(server: GradeServer) -> int:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await server.serve(stop)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
