"""One module per command group. Each imports only typer at module level; the work's imports are lazy."""
