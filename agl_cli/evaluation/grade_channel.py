"""The controller's side of grading in a container of its own: a request out, an answer back, through a shared folder.

In a cluster the trainer's pod (the Job's, or a RayJob's head) runs every grader in its `grader` container: another
uid, no ServiceAccount token, no credential in its environment or on its volumes, no view of the controller's
processes. The two containers share one emptyDir (`$AGL_GRADER_DIR`), laid out so that neither side ever writes
where the other decides what a name points to:

    requests/            the controller's (mode 0755): ID.task.json, ID.output, then ID.json (the request, renamed
                         into place last: its presence means the other two are complete)
    answers/             the grader container's (agl_cli/evaluation/grade_server.py): ID.taken once it starts a
                         request, then ID.json (renamed into place) with the grader's exit code and output tails

The request names the grader command (placeholders unfilled: the server fills them with its own paths and python)
and its timeout. The controller waits `pickup_s` for ID.taken and then the grader's timeout plus a grace for the
answer; past either it says which, and the rollout gets no reward (never a 0). Answers are opened without following
links and read up to a bound: the grader side cannot make the controller read one of its own files.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import stat
import time
from pathlib import Path
from typing import Any

from rl_backend.rollout.base import ProcessResult

GRADER_DIR_ENV = "AGL_GRADER_DIR"  # set in the trainer's container when the pod has a grader container
PICKUP_S = 60.0  # a grader container that is running takes a request within a poll; 60 s covers a restart
ANSWER_GRACE_S = 30.0  # past the grader's own timeout: the server kills it at timeout_s and still has to answer
MAX_ANSWER_BYTES = 4 * 1024 * 1024
POLL_S = 0.05


class GraderChannelError(RuntimeError):
    """The shared folder is not what the controller made it (a link, another owner): nothing is sent through it."""


def _own_dir(path: Path, mode: int) -> int:
    """`path` as a directory this uid created (not a link the other container put there), with `mode`; returns an
    open descriptor of it: the controller writes through it, so renaming the path away or putting a link in its
    place (the shared emptyDir itself is writable by both containers) never redirects a write."""
    with contextlib.suppress(FileExistsError):
        path.mkdir(mode=mode)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError:
        raise GraderChannelError(f"{path} is not a directory (a link?): the grader channel is not used") from None
    if os.fstat(fd).st_uid != os.getuid():
        os.close(fd)
        raise GraderChannelError(f"{path} is not a directory of uid {os.getuid()}: the grader channel is not used")
    os.fchmod(fd, mode)  # mkdir's mode is cut by the umask
    return fd


def read_bounded(path: Path, limit: int | None = MAX_ANSWER_BYTES) -> bytes | None:
    """A regular file's bytes, not following a link, up to `limit` (None: all); None when it is not there (yet)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        return None
    except OSError as exc:  # ELOOP: a link in its place
        raise GraderChannelError(f"{path} is not a regular file ({exc.strerror})") from None
    with os.fdopen(fd, "rb") as handle:
        if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
            raise GraderChannelError(f"{path} is not a regular file")
        return handle.read() if limit is None else handle.read(limit + 1)


def write_atomic(path: Path, data: bytes, mode: int = 0o644, *, dir_fd: int | None = None) -> None:
    """Complete or absent: the reader polls for the name, so it is renamed into place only once written. With
    `dir_fd`, `path`'s name is taken in that directory, whatever its path now leads to."""
    name = path.name if dir_fd is not None else str(path)
    partial = f".{path.name}.{secrets.token_hex(4)}.partial"
    partial = partial if dir_fd is not None else str(path.with_name(partial))
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode, dir_fd=dir_fd)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)
        os.fchmod(handle.fileno(), mode)
    os.replace(partial, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)


class GraderChannel:
    """Sends one grading at a time per call; any number of calls may be in flight (one file set each)."""

    def __init__(self, root: Path, *, pickup_s: float = PICKUP_S, grace_s: float = ANSWER_GRACE_S) -> None:
        self.root = root
        self.pickup_s = pickup_s
        self.grace_s = grace_s
        self.requests = root / "requests"
        self._requests_fd = _own_dir(self.requests, 0o755)
        self.answers = root / "answers"

    async def run(self, command: str, *, rollout_id: str, task_file: Path, output_file: Path,
                  timeout_s: float) -> ProcessResult:
        """Grade through the grader container: `command` is the grader's command line with its placeholders."""
        request_id = f"{_safe(rollout_id)}-{secrets.token_hex(6)}"
        files = [self.requests / f"{request_id}.{suffix}" for suffix in ("task.json", "output", "json")]
        started = time.monotonic()
        fd = self._requests_fd
        try:
            write_atomic(files[0], task_file.read_bytes(), dir_fd=fd)
            write_atomic(files[1], output_file.read_bytes(), dir_fd=fd)
            request = {"id": request_id, "rollout_id": rollout_id, "command": command, "timeout_s": timeout_s}
            write_atomic(files[2], json.dumps(request).encode(), dir_fd=fd)
            answer = await self._wait(request_id, timeout_s)
        finally:
            for path in files:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path.name, dir_fd=fd)
        return _result(answer, time.monotonic() - started)

    async def _wait(self, request_id: str, timeout_s: float) -> dict[str, Any]:
        taken, answer = self.answers / f"{request_id}.taken", self.answers / f"{request_id}.json"
        deadline = time.monotonic() + self.pickup_s
        picked_up = False
        while True:
            data = read_bounded(answer)
            if data is not None:
                return _parse(data, answer)
            if not picked_up and read_bounded(taken) is not None:
                picked_up = True
                deadline = time.monotonic() + timeout_s + self.grace_s
            if time.monotonic() > deadline:
                if picked_up:
                    raise TimeoutError(f"the grader container took the request but gave no answer within "
                                       f"{timeout_s + self.grace_s:g} s (the grader's timeout_s plus {self.grace_s:g} s)")
                raise TimeoutError(f"no grader container answered within {self.pickup_s:g} s: is this pod's `grader` "
                                   f"container running? (`kubectl logs POD -c grader`; it serves {self.root})")
            await asyncio.sleep(POLL_S)


def _safe(text: str) -> str:
    return "".join(c if c.isalnum() or c in "-_" else "_" for c in text)[:80] or "r"


def _parse(data: bytes, path: Path) -> dict[str, Any]:
    if len(data) > MAX_ANSWER_BYTES:
        raise GraderChannelError(f"the grader container's answer {path.name} is over {MAX_ANSWER_BYTES} bytes")
    try:
        answer = json.loads(data)
    except ValueError:
        raise GraderChannelError(f"the grader container's answer {path.name} is not JSON") from None
    if not isinstance(answer, dict):
        raise GraderChannelError(f"the grader container's answer {path.name} is not a JSON object")
    return answer


def _result(answer: dict[str, Any], duration_s: float) -> ProcessResult:
    code = answer.get("exit_code")
    out, err = str(answer.get("stdout_tail", "")), str(answer.get("stderr_tail", ""))
    return ProcessResult(
        exit_code=code if isinstance(code, int) and not isinstance(code, bool) else None,
        timed_out=answer.get("timed_out") is True,
        duration_s=duration_s,
        stdout_tail=out, stderr_tail=err, stdout_bytes=len(out), stderr_bytes=len(err),
    )
