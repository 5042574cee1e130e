"""`python -m agl_cli` is `agl`."""

from agl_cli.main import main

main()
