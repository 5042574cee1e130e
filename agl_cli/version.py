"""agl's own version, as installed: shown by `agl --version` and recorded in every run's manifest."""

from __future__ import annotations


def installed_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("agl")
    except PackageNotFoundError:
        return "unknown"
