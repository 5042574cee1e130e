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
        from agl_cli.errors import AglError, UsageError
        from rl_backend.store.db import StoreError

        try:
            return function(*args, **kwargs)
        except (AglError, StoreError) as exc:
            from rich.markup import escape

            from agl_cli.console import stderr_console

            # A store agl cannot use (damaged, newer than this agl, held by another process) is the user's to fix.
            error = exc if isinstance(exc, AglError) else UsageError(str(exc))
            console = stderr_console()
            # Escaped: messages quote commands such as pip install 'agl[otel]', whose brackets are not markup.
            console.print(f"[bold red]error:[/] {escape(error.message)}", markup=True, highlight=False)
            if error.hint:
                console.print(f"[dim]hint:[/] {escape(error.hint)}")
            raise typer.Exit(error.exit_code) from None

    return wrapper  # type: ignore[return-value]
