"""`agl runs`: the runs in the runs folder, newest last."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from agl_cli.cli_support import handle_errors


@handle_errors
def runs_command(
    runs_dir: Annotated[Path | None, typer.Option(help="Where runs live.")] = None,
    json_output: Annotated[bool, typer.Option("--json", help="Print one JSON document on stdout.")] = False,
) -> None:
    """List runs: id, kind, status, spec."""

    from rich.table import Table
    from rich.text import Text

    from agl_cli.console import print_json, print_table, stdout_console
    from agl_cli.rundir import MANIFEST, read_manifest, runs_root

    root = runs_root(runs_dir)
    rows: list[dict[str, Any]] = []
    for path in sorted(root.glob("*")) if root.is_dir() else []:
        if (path / MANIFEST).is_file():
            manifest: dict[str, Any] = read_manifest(path) or {"status": "damaged manifest"}
            rows.append({
                "run_id": path.name, "kind": manifest.get("kind"), "status": manifest.get("status"),
                "spec": manifest.get("spec_path"), "split": manifest.get("split"),
                "variants": [str(v.get("name")) for v in manifest.get("variants", []) if isinstance(v, dict)],
            })
    if json_output:
        print_json({"runs_dir": str(root), "runs": rows})
        return
    table = Table(title=f"runs in {root}", title_justify="left")
    for column in ("run", "kind", "status", "split", "variants", "spec"):
        table.add_column(column)
    for row in rows:
        cells = (row["run_id"], row["kind"] or "", row["status"] or "", row["split"] or "all",
                 ", ".join(row["variants"]), row["spec"] or "")
        table.add_row(*(Text(cell) for cell in cells))
    print_table(stdout_console(), table)
