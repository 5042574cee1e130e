"""What every command shares: turning AglError into a message and exit code, never a traceback."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

import typer

F = TypeVar("F", bound=Callable[..., Any])


def handle_errors(function: F) -> F:
    @functools.wraps(function)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        from agl_cli.errors import AglError
        from rl_backend.store.db import StoreError

        try:
            return function(*args, **kwargs)
        except (AglError, StoreError) as exc:
            from rich.markup import escape

            from agl_cli.console import stderr_console

            # A store agl cannot use (damaged, newer than this agl, locked, on a full disk) says what to do; its
            # exit code is 2 for what the user must fix, 1 for a failure of the machine.
            error = exc if isinstance(exc, AglError) else store_error(exc)
            console = stderr_console()
            # Escaped: messages quote commands such as pip install 'agl[otel]', whose brackets are not markup.
            console.print(f"[bold red]error:[/] {escape(error.message)}", markup=True, highlight=False)
            if error.hint:
                console.print(f"[dim]hint:[/] {escape(error.hint)}")
            raise typer.Exit(error.exit_code) from None

    return wrapper  # type: ignore[return-value]


def store_error(exc: Exception) -> Any:
    """The AglError a StoreError stands for: its message, hint and exit code."""
    from agl_cli.errors import AglError

    error = AglError(str(exc), hint=getattr(exc, "hint", None))
    error.exit_code = int(getattr(exc, "exit_code", 2))
    return error
