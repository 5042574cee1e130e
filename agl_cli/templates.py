"""Where the jinja2 templates live: `templates/` in a checkout, `agl_cli/_templates` inside the wheel."""

from __future__ import annotations

from pathlib import Path

import jinja2


def templates_dir() -> Path:
    packaged = Path(__file__).parent / "_templates"
    if packaged.is_dir():
        return packaged
    return Path(__file__).resolve().parent.parent / "templates"


def environment() -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(templates_dir())),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        autoescape=False,
    )


def render(template: str, **context: object) -> str:
    return environment().get_template(template).render(**context)
