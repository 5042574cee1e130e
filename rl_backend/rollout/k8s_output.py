"""Reading a rollout's results back from its pod log.

A pod's files vanish with it, and Kubernetes offers no file copy without exec rights (kubectl cp is exec + tar).
So the wrapper script (templates/k8s/wrapper.sh.j2) prints, after the agent exits, one block to stdout:

    AGL-<marker> begin
    AGL-<marker> stderr <size in bytes>
    <base64 of the last bytes of the agent's stderr>
    AGL-<marker> output <size in bytes>      (or: AGL-<marker> no-output)
    <base64 of the output file, at most max_output_bytes>
    AGL-<marker> exit <code>
    AGL-<marker> end

The marker is random per rollout (kept in the Job's annotations), so nothing the agent prints can pass for it;
the last complete block wins. Everything before the block is the agent's live output (stdout and stderr
interleaved, as the container runtime keeps them). Being last, the block survives kubelet log rotation, which
drops the oldest part of a long log. The stream is read once, keeping bounded memory.
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass, field

from rl_backend.rollout.local import _Tail


@dataclass
class PodOutput:
    log_tail: str = ""  # the agent's live output, before the block
    log_bytes: int = 0
    stderr: str | None = None  # the agent's stderr tail, from the block
    stderr_size: int | None = None  # the whole stderr's size in the pod
    output: bytes | None = None  # the output file's content, None when the agent wrote none
    output_size: int | None = None  # its size in the pod (larger than len(output) when truncated)
    exit_code: int | None = None
    complete: bool = False  # a whole block was found
    problems: list[str] = field(default_factory=list)


class LogReader:
    """Feed the pod log in chunks of any size; `result()` parses what came."""

    def __init__(self, marker: str, tail_bytes: int, max_block_bytes: int) -> None:
        self.prefix = f"AGL-{marker} ".encode()
        self.tail = _Tail(tail_bytes)
        self.max_block_bytes = max_block_bytes
        self.pending = b""
        self.block: list[bytes] | None = None  # lines of the block being read
        self.block_bytes = 0
        self.last_block: list[bytes] | None = None
        self.overflow = False

    def feed(self, chunk: bytes) -> None:
        data = self.pending + chunk
        lines = data.split(b"\n")
        self.pending = lines.pop()
        for line in lines:
            self._line(line + b"\n")

    def _line(self, line: bytes) -> None:
        stripped = line.rstrip(b"\r\n")
        if stripped == self.prefix + b"begin":
            self.block, self.block_bytes = [], 0
            return
        if self.block is None:
            self.tail.feed(line)
            return
        if stripped == self.prefix + b"end":
            self.last_block, self.block = self.block, None
            return
        self.block_bytes += len(line)
        if self.block_bytes > self.max_block_bytes:
            # Not ours after all, or far larger than announced: give the lines back to the log.
            self.overflow = True
            for kept in self.block:
                self.tail.feed(kept + b"\n")
            self.tail.feed(line)
            self.block = None
            return
        self.block.append(stripped)

    def result(self) -> PodOutput:
        if self.pending:
            self._line(self.pending)
            self.pending = b""
        if self.block is not None:  # a block that never ended (the pod was killed while printing it)
            for kept in self.block:
                self.tail.feed(kept + b"\n")
            self.block = None
        out = PodOutput(log_tail=self.tail.text(), log_bytes=self.tail.total)
        if self.overflow:
            out.problems.append("an output block in the pod log was larger than expected and was ignored")
        if self.last_block is not None:
            self._parse(self.last_block, out)
        return out

    def _parse(self, lines: list[bytes], out: PodOutput) -> None:
        sections: dict[str, list[bytes]] = {}
        current: str | None = None
        for line in lines:
            if line.startswith(self.prefix):
                words = line[len(self.prefix):].decode("ascii", errors="replace").split()
                current = words[0] if words else "?"
                sections[current] = []
                if current == "exit" and len(words) > 1 and words[1].lstrip("-").isdigit():
                    out.exit_code = int(words[1])
                elif current == "output" and len(words) > 1 and words[1].isdigit():
                    out.output_size = int(words[1])
                elif current == "stderr" and len(words) > 1 and words[1].isdigit():
                    out.stderr_size = int(words[1])
            elif current is not None:
                sections[current].append(line)
        try:
            if "stderr" in sections:
                out.stderr = base64.b64decode(b"".join(sections["stderr"]), validate=True).decode(
                    "utf-8", errors="replace"
                )
            if "output" in sections:
                out.output = base64.b64decode(b"".join(sections["output"]), validate=True)
        except (binascii.Error, ValueError):
            out.problems.append("the output block in the pod log is corrupted (did something else write to stdout?)")
            out.output = None
            return
        out.complete = "exit" in sections
