"""`agl train` and the readiness verdict before it: the local, async and verl jobs, `agl advise`."""
