"""Errors that the CLI turns into a clear message and an exit code, never a traceback."""

from __future__ import annotations


class AglError(Exception):
    """A failure the user can act on. `exit_code` follows the contract: 1 failure, 2 usage or config error."""

    exit_code = 1

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return self.message if not self.hint else f"{self.message}\n  hint: {self.hint}"


class ConfigError(AglError):
    exit_code = 2


class UsageError(AglError):
    exit_code = 2
