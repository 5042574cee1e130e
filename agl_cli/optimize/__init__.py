"""`agl optimize`: search the spec's knobs on the validation split, confirm the winner on the held-out test split.

- `space`: which variants to try (baseline, explicit, grid, the grid of a few knobs from a kept setting, seeded
  sample, candidate files, extra options);
- `racing`: the racing strategy's pure logic (schedule, drop rule), shared by the CLI and the benchmark;
- `reflect`: the reflect strategy (an LLM proposer rewrites a prompt file; kept only when `better` than its parent),
  with `proposer` (the request from failing transcripts, the call through the gateway) and `pareto` (the per-task
  front its parents are drawn from);
- `objectives`: the Pareto front over agl_cli.metrics' accuracy, cost, latency and pass^k; the choice under
  constraints;
- `frontier`: what the user chooses from: the configurations no other beats on accuracy, cost and p95 latency,
  priced at their volume, its ends (most accurate, cheapest good) and each step between neighbours, decided or not;
- `cache`: the agent version and reuse of finished rollouts from earlier runs;
- `study`: the study directory, its budget ledger and the runner that respects it;
- `engine`: the whole flow; `projection`: `--dry-run`; `best_config`: writing `agl.best.yaml`.
"""
