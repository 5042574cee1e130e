"""The `agl` command. Sub-commands live in agl_cli.commands; nothing heavy is imported until one runs."""

from __future__ import annotations

from typing import Annotated

import typer

from agl_cli.commands import (
    advise_cmd,
    compare_cmd,
    doctor_cmd,
    eval_cmd,
    gateway_cmd,
    init_cmd,
    optimize_cmd,
    report_cmd,
    runs_cmd,
    serve_cmd,
    skill_cmd,
    spend_cmd,
    tasks_cmd,
    train_cmd,
    train_group,
    train_k8s,
    transcript_cmd,
)

app = typer.Typer(
    name="agl",
    help="Make an AI agent better, from prompt edits to weight training, without rewriting the agent.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _print_version(value: bool) -> None:
    if value:
        from rl_backend.version import installed_version

        typer.echo(f"agl {installed_version()}")
        raise typer.Exit()


@app.callback()
def root(
    version: Annotated[bool, typer.Option("--version", callback=_print_version, is_eager=True,
                                          help="Print agl's version and exit.")] = False,
) -> None:
    """Make an AI agent better, from prompt edits to weight training, without rewriting the agent."""


app.command("eval")(eval_cmd.eval_command)
app.command("compare")(compare_cmd.compare_command)
app.command("optimize")(optimize_cmd.optimize_command)
app.command("init")(init_cmd.init_command)
app.command("doctor")(doctor_cmd.doctor_command)
app.command("runs")(runs_cmd.runs_command)
app.command("spend")(spend_cmd.spend_command)
app.command("report")(report_cmd.report_command)
app.command("transcript")(transcript_cmd.transcript_command)
app.command("tasks")(tasks_cmd.tasks_command)
app.command("serve")(serve_cmd.serve_command)
app.command("advise")(advise_cmd.advise_command)
app.add_typer(skill_cmd.app, name="skill")
app.add_typer(gateway_cmd.app, name="gateway")

train_app = typer.Typer(
    cls=train_group.TrainGroup,
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    help="Train the model's weights through the unchanged agent: agl train CONFIG (locally), agl train CONFIG "
    "--backend verl (GPUs), agl train CONFIG --on kubernetes (a cluster); agl train status|stop NAME (cluster "
    "runs). Each form's flags are listed below.",
)
train_app.command("run", hidden=True)(train_cmd.train_command)
train_k8s.register(train_app)
app.add_typer(train_app, name="train")


def main() -> None:
    app()


if __name__ == "__main__":
    main()
