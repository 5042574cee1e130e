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

        try:
            return function(*args, **kwargs)
        except AglError as exc:
            from rich.markup import escape

            from agl_cli.console import stderr_console

            console = stderr_console()
            # Escaped: messages quote commands such as pip install 'agl[otel]', whose brackets are not markup.
            console.print(f"[bold red]error:[/] {escape(exc.message)}", markup=True, highlight=False)
            if exc.hint:
                console.print(f"[dim]hint:[/] {escape(exc.hint)}")
            raise typer.Exit(exc.exit_code) from None

    return wrapper  # type: ignore[return-value]
