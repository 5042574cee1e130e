"""agl's own version, as installed (both packages ship in the one `agl` distribution): shown by `agl --version`,
recorded in every run's manifest, sent with exported spans, and the tag of the default runtime and trainer images."""

from __future__ import annotations


def installed_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("agl")
    except PackageNotFoundError:
        return "unknown"
