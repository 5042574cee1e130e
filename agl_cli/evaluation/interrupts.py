"""SIGTERM stops a long command (eval, optimize, train) the way Ctrl-C does: what finished is kept, the run is
marked interrupted and the resume command is printed; only the exit status differs, 143 (128 + SIGTERM) instead
of 130, as a supervisor that sent SIGTERM expects."""

from __future__ import annotations

import signal
from types import FrameType, TracebackType

INTERRUPTED = 130  # 128 + SIGINT
TERMINATED = 143  # 128 + SIGTERM


class TermAsInterrupt:
    """`with TermAsInterrupt() as stop:` turns a SIGTERM received in the block into a SIGINT (so every Ctrl-C path,
    asyncio's included, runs as it does for Ctrl-C); `stop.exit_code` is then the status to exit with."""

    def __init__(self) -> None:
        self.terminated = False
        self._previous: signal.Handlers | int | None = None
        self._installed = False

    def _on_term(self, signum: int, frame: FrameType | None) -> None:
        self.terminated = True
        signal.raise_signal(signal.SIGINT)

    @property
    def exit_code(self) -> int:
        return TERMINATED if self.terminated else INTERRUPTED

    def __enter__(self) -> TermAsInterrupt:
        try:
            self._previous = signal.signal(signal.SIGTERM, self._on_term)  # type: ignore[assignment]
            self._installed = True
        except ValueError:  # not the main thread (a test runner's worker): SIGTERM keeps its own meaning
            pass
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self._installed:
            signal.signal(signal.SIGTERM, self._previous)
