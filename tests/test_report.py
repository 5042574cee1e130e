"""`agl report`: Markdown and HTML from stored fixture runs (one-variant eval, multi-variant study, training run),
GitHub-valid tables, links that resolve, secrets removed, a self-contained HTML file, and the regression gate."""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from html.parser import HTMLParser
from pathlib import Path

import pytest

from agl_cli.errors import UsageError
from agl_cli.metrics.fmt import usd
from agl_cli.report import regression_verdict, write_report
from agl_cli.report.markup import fence, md_escape
from agl_cli.report.redact import scrub, scrub_text
from agl_cli.report.svg import nice_ticks
from tests.helpers import invoke_agl, run_agl
from tests.helpers.make_runs import PLANTED_SECRETS, make_all, make_scored_run


def split_row(line: str) -> list[str]:
    """The cells of a GFM table row: split on pipes not escaped by a backslash, outer pipes dropped."""
    cells = re.split(r"(?<!\\)\|", line.strip())
    assert cells[0] == "" and cells[-1] == "", f"a row must start and end with a pipe: {line!r}"
    return cells[1:-1]


def md_tables(text: str) -> list[list[str]]:
    """Blocks of consecutive lines starting with `|` (outside code fences), each preceded by a blank line."""
    tables: list[list[str]] = []
    lines = text.splitlines()
    in_fence = False
    for i, line in enumerate(lines):
        if line.startswith("```"):
            in_fence = not in_fence
        if in_fence or not line.startswith("|"):
            continue
        if i > 0 and lines[i - 1].startswith("|"):
            tables[-1].append(line)
        else:
            assert i == 0 or not lines[i - 1].strip(), f"a table must follow a blank line: {lines[i - 1]!r}"
            tables.append([line])
    return tables


@pytest.fixture(scope="module")
def reports(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, list[Path]]]:
    root = tmp_path_factory.mktemp("runs")
    return {kind: (path, write_report(path)) for kind, path in make_all(root).items()}


def _text(paths: list[Path], name: str) -> str:
    return next(p for p in paths if p.name == name).read_text()


def test_eval_with_one_variant_reports_accuracy_with_n_and_interval_and_its_failures(reports) -> None:
    run, paths = reports["eval"]
    md = _text(paths, "report.md")
    verdict = md.split("## Verdict", 1)[1].split("##", 1)[0]
    # 8 of 10: a Wilson interval, as every accuracy of 0/1 rewards has.
    assert "**80.0% \\[49.0, 94.3\\]**" in verdict and "n = 10 scored rollouts over 10 tasks" in verdict
    assert "on the test split" in verdict and "per task" in verdict
    assert "agent timeout 1" in verdict and "grader crashed 1" in verdict and "2 got a reward below 0.5" in verdict
    assert "pareto_cost.svg" not in md  # one point is no Pareto plot
    failures = md.split("## Failures", 1)[1].split("##", 1)[0]
    assert "| agent timeout | grader crashed |" in failures and "1 in 1 rollouts" in failures
    assert "the agent ran past its 30 s timeout" in failures
    assert {p.name for p in paths} >= {"report.md", "report.html", "transcripts.md", "spend_cost.svg", "spend_tokens.svg"}
    assert all(p.parent == run / "report" for p in paths)


def test_study_names_the_winner_with_its_held_out_interval_and_marks_it_on_the_pareto_plots(reports) -> None:
    _, paths = reports["study"]
    md = _text(paths, "report.md")
    verdict = md.split("## Verdict", 1)[1].split("##", 1)[0]
    assert "It chose **model=gpt-4.1-mini**" in verdict
    assert "is better than the baseline by **+62.5 points \\[" in verdict and "on the test split (12 tasks" in verdict
    assert "cost per task $0.001100 vs $0.000200" in verdict and "Recommendation: **adopt**" in verdict
    assert "> **Note:** the test gain falls short" in md
    assert "pass^2 \\[95% CI\\]" in md and "dropped in round 1" in md
    assert "model=claude\\|haiku" in md  # a pipe in a variant name is escaped, the table stays intact
    for name in ("pareto_cost.svg", "pareto_latency.svg"):
        assert f"]({name})" in md
        svg = next(p for p in paths if p.name == name).read_text()
        root = ET.fromstring(svg)  # well-formed XML, so GitHub renders it as an image
        assert root.tag == "{http://www.w3.org/2000/svg}svg"
        assert "<polygon" in svg and "<rect x=" in svg  # winner diamond, baseline square
        assert svg.count("<path d=\"M") >= 4  # error bars
        assert ">model=gpt-4.1-mini<" in svg and ">baseline<" in svg
    flips = md.split("## Tasks that flipped", 1)[1].split("##", 1)[0]
    assert "gained, 0 lost on the test split" in flips and "[winner s1](transcripts.md#" in flips


def test_training_run_renders_curves_first_and_before_after(reports) -> None:
    _, paths = reports["train"]
    md = _text(paths, "report.md")
    assert md.index("## Training") < md.index("## Variants")
    for key in ("reward", "pass_rate", "entropy", "kl", "tokens_per_s"):
        assert f"](train_{key}.svg)" in md
        ET.fromstring(_text(paths, f"train_{key}.svg"))
    assert "| reward | 0.3 (step 0) | 0.8 (step 29) |" in md
    assert "between **after** and the baseline **before**" in md
    # The training rollouts are not a candidate: the verdict is the held-out before/after pair alone.
    verdict = md.split("## Verdict", 1)[1].split("\n## ", 1)[0]
    assert "candidates" not in verdict and "**train**" not in verdict and "| train |" not in md.split("## Run")[0]


def test_train_metrics_can_be_passed_in(tmp_path: Path, reports) -> None:
    run, _ = reports["eval"]
    metrics = [{"step": s, "reward": s / 10, "kl": 0.01 * s} for s in range(5)]
    paths = write_report(run, ("md",), out_dir=tmp_path, train_metrics=metrics)
    names = {p.name for p in paths}
    assert {"train_reward.svg", "train_kl.svg"} <= names and "train_entropy.svg" not in names
    assert "report.html" not in names


def test_markdown_tables_are_valid_as_github_renders_them(reports) -> None:
    from markdown_it import MarkdownIt

    parser = MarkdownIt("commonmark").enable("table")
    for _, paths in reports.values():
        for path in (p for p in paths if p.suffix == ".md"):
            text = path.read_text()
            tables = md_tables(text)
            rendered = parser.parse(text)
            assert sum(1 for t in rendered if t.type == "table_open") == len(tables), path
            for lines in tables:
                width = len(split_row(lines[0]))
                assert all(re.fullmatch(r"\s*:?-{3,}:?\s*", c) for c in split_row(lines[1])), lines[1]
                for line in lines:
                    assert len(split_row(line)) == width, (path.name, line)


def test_every_transcript_link_resolves(reports) -> None:
    for _, paths in reports.values():
        md, transcripts = _text(paths, "report.md"), _text(paths, "transcripts.md")
        headings = set(re.findall(r"^## (\S+)$", transcripts, re.M))
        links = set(re.findall(r"\]\(transcripts\.md#([^)]+)\)", md))
        assert links and links <= headings
        page = _text(paths, "report.html")
        ids = set(re.findall(r'\sid="([^"]+)"', page))
        hrefs = set(re.findall(r'href="#([^"]+)"', page))
        assert hrefs and hrefs <= ids


def test_secrets_never_reach_a_report(reports) -> None:
    _, paths = reports["eval"]
    everything = "".join(p.read_text() for p in paths)
    for secret in PLANTED_SECRETS:
        assert secret not in everything
        assert secret.split("-")[-1].split("_")[-1] not in everything
    shown = _text(paths, "transcripts.md") + _text(paths, "report.html")
    assert "sk-[redacted]" in shown and "Authorization: [redacted]" in shown and "OPENAI_API_KEY=[redacted]" in shown


class _Checker(HTMLParser):
    VOID = {"meta", "br", "img", "input", "link", "hr", "path", "circle", "line", "rect", "polygon", "source"}

    def __init__(self) -> None:
        super().__init__()
        self.stack: list[str] = []
        self.tags: list[tuple[str, dict[str, str | None]]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))
        if tag not in self.VOID:
            self.stack.append(tag)

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))

    def handle_endtag(self, tag: str) -> None:
        assert self.stack and self.stack[-1] == tag, f"</{tag}> closes <{self.stack[-1] if self.stack else None}>"
        self.stack.pop()


def test_html_is_one_self_contained_file_readable_without_javascript(reports) -> None:
    for kind, (_, paths) in reports.items():
        page = _text(paths, "report.html")
        checker = _Checker()
        checker.feed(page)
        assert checker.stack == [], kind  # every element closed
        tags = [t for t, _ in checker.tags]
        assert "script" not in tags and "link" not in tags and "iframe" not in tags
        for _, attrs in checker.tags:
            for name in ("src", "href"):
                assert not (attrs.get(name) or "#").startswith(("http", "//")), attrs
        assert "@import" not in page and "url(" not in page
        assert "default-src 'none'" in page and 'name="viewport"' in page
        assert tags.count("details") == len(re.findall(r"^## ", _text(paths, "transcripts.md"), re.M))
        assert ".scroll { overflow-x: auto" in page
    page = _text(reports["study"][1], "report.html")
    assert page.count("<svg") == 4 and "<strong>model=gpt-4.1-mini</strong>" in page


def test_cli_writes_the_chosen_format_and_reports_paths_as_json(tmp_path: Path, reports) -> None:
    run, _ = reports["study"]
    result = run_agl(["report", str(run), "--format", "md", "--out", str(tmp_path / "out"), "--json"], cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["kind"] == "study" and doc["formats"] == ["md"]
    assert doc["report"] == {"md": str(tmp_path / "out" / "report.md")}
    assert all(Path(f).is_file() and Path(f).parent == tmp_path / "out" for f in doc["files"])
    missing = invoke_agl(["report", "no-such-run", "--runs-dir", str(tmp_path)], cwd=tmp_path)
    assert missing.returncode == 2 and "no run 'no-such-run'" in missing.stderr


def test_regression_verdict(tmp_path: Path) -> None:
    good = [1.0] * 16 + [0.0] * 4
    base = make_scored_run(tmp_path, "base", good)
    worse = make_scored_run(tmp_path, "worse", [0.0] * 14 + [1.0] * 2 + [0.0] * 4)
    same = make_scored_run(tmp_path, "same", good)
    crashy = make_scored_run(tmp_path, "crashy", [None] * 12 + [1.0] * 4 + [0.0] * 4)
    regression, text = regression_verdict(base, worse)
    assert regression and "worse" in text and "-70.0 points" in text
    regression, text = regression_verdict(base, same)
    assert not regression and "no regression detected" in text and "no detectable difference" in text
    regression, text = regression_verdict(str(base), str(crashy))  # crashes are not zeros, but they do regress
    assert regression and "12 pairs lost their reward" in text
    other = make_scored_run(tmp_path, "other", [1.0] * 3, prefix="h")
    with pytest.raises(UsageError):
        regression_verdict(base, other)


def test_formatting_and_redaction_units() -> None:
    assert md_escape("a|b\nc") == "a\\|b c" and md_escape("<x>") == "\\<x\\>"
    assert fence("has ``` inside") == "````"
    assert usd(0.00042) == "$0.000420" and usd(0.5, [0.5, 0.5]) == "$0.5000"
    assert nice_ticks(0, 0.87) == [0, 0.2, 0.4, 0.6, 0.8, 1.0]
    assert nice_ticks(3, 3)[0] <= 3 <= nice_ticks(3, 3)[-1]
    assert scrub_text("key sk-abc123def456 and Bearer abcdef123456") == "key sk-[redacted] and Bearer [redacted]"
    assert scrub_text("MAX_TOKENS=1000 OPENAI_API_KEY=hunter22") == "MAX_TOKENS=1000 OPENAI_API_KEY=[redacted]"
    assert scrub({"headers": {"Authorization": "x"}, "max_tokens": 5}) == {
        "headers": {"Authorization": "[redacted]"}, "max_tokens": 5}
