"""`agl train` as a group whose default command takes the CONFIG, and a `--help` that lists every form's flags.

`agl train CONFIG ...` runs a hidden command picked from the arguments: `k8s` with `--on kubernetes` (the cluster),
`verl` with `--backend verl` (GPUs; what the trainer image runs), else `run` (local training, the torch backend);
`status` and `stop` are ordinary commands. Each form keeps its own options; `agl train --help` (and `agl train CONFIG
--help`) shows them all, form by form, and the reference docs read the same list (`forms`).
"""

from __future__ import annotations

from typing import Any

from typer.core import HAS_RICH, TyperGroup

# (hidden command, how it is invoked, what it does): the forms of `agl train CONFIG`.
FORMS = (
    ("run", "agl train CONFIG [OPTIONS]", "train locally, the torch backend (`--backend torch` names it)"),
    ("verl", "agl train CONFIG --backend verl [OPTIONS]", "train on GPUs with verl and vLLM"),
    ("k8s", "agl train CONFIG --on kubernetes [OPTIONS]", "deploy and follow a trainer on a cluster"),
)


def _flag_given(args: list[str], flag: str, value: str) -> bool:
    return any(a == f"{flag}={value}" or (a == flag and args[i + 1:i + 2] == [value]) for i, a in enumerate(args))


def _without_backend_torch(args: list[str]) -> list[str]:
    out: list[str] = []
    skip = False
    for i, a in enumerate(args):
        if skip:
            skip = False
        elif a == "--backend=torch":
            continue
        elif a == "--backend" and args[i + 1:i + 2] == ["torch"]:
            skip = True
        else:
            out.append(a)
    return out


class TrainGroup(TyperGroup):
    """See the module docstring."""

    @staticmethod
    def default_command_for(args: list[str]) -> str:
        """The hidden command `agl train CONFIG ARGS` runs: `k8s` with `--on kubernetes`, `verl` with
        `--backend verl`, else `run`."""
        if _flag_given(args, "--on", "kubernetes"):
            return "k8s"
        return "verl" if _flag_given(args, "--backend", "verl") else "run"

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        if args and args[0] not in self.commands and args[0] not in ("--help", "-h"):
            command = self.default_command_for(args)
            if command == "run":
                if any(a in ("--help", "-h") for a in args[1:]):
                    # `agl train CONFIG --help`: the local form cannot list --backend and --on; the group lists all.
                    args = ["--help"]
                    return super().parse_args(ctx, args)
                args = _without_backend_torch(args)  # `--backend torch` names the default; the command lacks it
            args = [command, *args]
        return super().parse_args(ctx, args)

    def collect_usage_pieces(self, ctx: Any) -> list[str]:
        return ["CONFIG [--backend torch|verl | --on kubernetes] [OPTIONS]", "|", "COMMAND [ARGS]..."]

    def forms(self, ctx: Any) -> list[tuple[str, str, Any, Any]]:
        """Each form as (usage, what it does, its command, a context to read its parameters in)."""
        result = []
        for name, usage, about in FORMS:
            command = self.commands.get(name)
            if command is not None:
                # typer carries its own copy of click: build the context with the class of the one given.
                result.append((usage, about, command, type(ctx)(command, info_name="", parent=ctx)))
        return result

    def format_help(self, ctx: Any, formatter: Any) -> None:
        super().format_help(ctx, formatter)
        for usage, about, command, sub in self.forms(ctx):
            records = [r for p in command.get_params(sub) if (r := p.get_help_record(sub)) is not None]
            if not HAS_RICH or self.rich_markup_mode is None:  # click's plain help: plain sections
                with formatter.section(f"{usage}: {about}"):
                    formatter.write_dl(records)
            else:
                _print_form(usage, about, records)


def _print_form(usage: str, about: str, records: list[tuple[str, str]]) -> None:
    """One form's options as a panel, after typer's own rich help (which it prints straight to stdout)."""
    from rich.console import Console
    from rich.markup import escape
    from rich.panel import Panel
    from rich.table import Table

    table = Table.grid(padding=(0, 2), expand=True)
    table.add_column(style="bold cyan", no_wrap=True)
    table.add_column()
    for name, text in records:
        table.add_row(escape(name), escape(text))
    title = f"[bold]{escape(usage)}[/]: {escape(about)}"
    Console().print(Panel(table, title=title, title_align="left", border_style="dim"))
