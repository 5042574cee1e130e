"""What agl measures and how it shows it, in one place: `agl eval`'s summary, the reports, `agl optimize` and
`agl advise` take their numbers from here.

- variant.py  VariantMetrics: one variant's accuracy, wrong answers and pass^k, missing rewards and why, errors,
              latency, tokens and cost (unknown when a call has no price), the models that served it; its JSON shapes
- run.py      a run's store read for its metrics: rollouts by variant, paired scores, every planned variant
              measured at once, and the pass threshold the run was measured with
- fmt.py      how numbers are written for a person: percentages, points, dollars, seconds, counts

What passing means (a reward of at least agl.yaml's `pass_threshold`) is rl_backend.rewards, so the trainer's pass
rate counts the same way. The statistics themselves are agl_cli.metrics.stats (intervals) and agl_cli.metrics.paired (verdicts).
"""
