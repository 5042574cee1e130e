"""Reports people read: Markdown (for GitHub) and one self-contained HTML file, from any run, study or training.

- `collect`: everything a report knows, read back from a run directory (per-split variants measured by
  agl_cli.metrics, paired comparison, flips, failures, spend, training metrics); `compare`, `usage`: its paired
  figures and call aggregates;
- `verdict`: the one-paragraph verdict; `failures`: the failure breakdown; `plots` + `svg`: hand-made SVG plots;
- `transcripts` + `redact`: rollout transcripts with secrets removed; `markup`: Markdown and HTML escaping;
- `context`: the templates' context (both formats say the same); `render`: writing the files;
- `gate`: `regression_verdict`, the decision behind `agl eval --fail-on-regression`.

Only the `agl report` command and the end of `agl eval` import this package (it pulls numpy).
"""

from __future__ import annotations

from agl_cli.report.gate import regression_verdict
from agl_cli.report.render import write_report

__all__ = ["regression_verdict", "write_report"]
