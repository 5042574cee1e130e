"""The coding tasks: six small Python packages, each with a real bug, its visible tests, and hidden tests.

    python make_repos.py            # writes tasks.jsonl and builds the repositories (idempotent)
    python make_repos.py --where    # prints where the repositories live

Each repository is a git repo with a history: a first commit with working code, then a "refactor" that introduced
the bug (so `git log -p` would show the fix: one reason the agent never sees .git). `tests/test_<module>.py` is
visible to the agent; `tests/test_hidden.py` holds the fail-to-pass tests for the bug and is not. The repositories
are built under $AGL_CODING_REPOS, else ~/.cache/agl/coding-repos/<hash of this file's task definitions>/, never in
the source tree; the agent and the grader call `ensure_repo()`, which builds them on first use.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent

# id -> package, module, issue text, fixed source, buggy source (as (old, new) replacements of the fixed one),
# visible tests, hidden tests. FIX is what the honest scripted model applies: the reverse of the bug.
REPOS: dict[str, dict] = {
    "slugify": {
        "package": "textkit", "module": "slug",
        "issue": "slugify() leaves runs of dashes and a trailing dash: slugify('Hello,  World!') returns "
                 "'hello---world-' but should return 'hello-world'.",
        "source": '''"""URL slugs."""
import re


def slugify(text: str) -> str:
    """Lowercase, keep letters and digits, join the words with single dashes."""
    slug = re.sub(r"[^a-z0-9]+", "-", text.lower())
    return slug.strip("-")
''',
        "bug": [('r"[^a-z0-9]+"', 'r"[^a-z0-9]"'), ('return slug.strip("-")', 'return slug.lstrip("-")')],
        "visible": '''from textkit.slug import slugify


def test_simple_word():
    assert slugify("Python") == "python"


def test_two_words():
    assert slugify("hello world") == "hello-world"
''',
        "hidden": '''from textkit.slug import slugify


def test_punctuation_and_spaces_collapse():
    assert slugify("Hello,  World!") == "hello-world"


def test_no_trailing_dash():
    assert slugify("agl rocks!!") == "agl-rocks"
''',
        "f2p": ["tests/test_hidden.py::test_punctuation_and_spaces_collapse", "tests/test_hidden.py::test_no_trailing_dash"],
    },
    "median": {
        "package": "statkit", "module": "center",
        "issue": "median() is wrong for lists with an even number of values: median([1, 2, 3, 4]) returns 3, "
                 "it should return 2.5 (the mean of the two middle values).",
        "source": '''"""Measures of the center of a list of numbers."""


def mean(values):
    return sum(values) / len(values)


def median(values):
    """The middle value of the sorted values; the mean of the two middle ones for an even count."""
    ordered = sorted(values)
    mid = len(ordered) // 2
    if len(ordered) % 2:
        return ordered[mid]
    return (ordered[mid - 1] + ordered[mid]) / 2
''',
        "bug": [("    if len(ordered) % 2:\n        return ordered[mid]\n    return (ordered[mid - 1] + ordered[mid]) / 2\n",
                 "    return ordered[mid]\n")],
        "visible": '''from statkit.center import mean, median


def test_mean():
    assert mean([1, 2, 3]) == 2


def test_median_odd():
    assert median([3, 1, 2]) == 2
''',
        "hidden": '''from statkit.center import median


def test_median_even():
    assert median([1, 2, 3, 4]) == 2.5


def test_median_even_unsorted():
    assert median([10, 2, 8, 4]) == 6
''',
        "f2p": ["tests/test_hidden.py::test_median_even", "tests/test_hidden.py::test_median_even_unsorted"],
    },
    "leap": {
        "package": "calendarkit", "module": "years",
        "issue": "is_leap_year(1900) returns True, but 1900 was not a leap year (centuries are leap years only "
                 "when divisible by 400, like 2000).",
        "source": '''"""Gregorian calendar helpers."""


def is_leap_year(year: int) -> bool:
    return year % 4 == 0 and (year % 100 != 0 or year % 400 == 0)


def days_in_year(year: int) -> int:
    return 366 if is_leap_year(year) else 365
''',
        "bug": [("return year % 4 == 0 and (year % 100 != 0 or year % 400 == 0)", "return year % 4 == 0")],
        "visible": '''from calendarkit.years import days_in_year, is_leap_year


def test_ordinary_leap_year():
    assert is_leap_year(2024)


def test_common_year():
    assert days_in_year(2023) == 365
''',
        "hidden": '''from calendarkit.years import days_in_year, is_leap_year


def test_century_is_not_leap():
    assert not is_leap_year(1900)
    assert days_in_year(2100) == 365


def test_400_is_leap():
    assert is_leap_year(2000)
''',
        "f2p": ["tests/test_hidden.py::test_century_is_not_leap"],
    },
    "discount": {
        "package": "shop", "module": "pricing",
        "issue": "apply_discount(200, 15) returns 30.0 — the discount itself — instead of the discounted price 170.0.",
        "source": '''"""Prices and discounts."""


def apply_discount(price: float, percent: float) -> float:
    """The price after taking `percent` percent off, rounded to cents."""
    if not 0 <= percent <= 100:
        raise ValueError("percent must be between 0 and 100")
    return round(price * (1 - percent / 100), 2)


def total(prices: list[float]) -> float:
    return round(sum(prices), 2)
''',
        "bug": [("return round(price * (1 - percent / 100), 2)", "return round(price * percent / 100, 2)")],
        "visible": '''import pytest

from shop.pricing import apply_discount, total


def test_total():
    assert total([1.10, 2.20]) == 3.3


def test_bad_percent():
    with pytest.raises(ValueError):
        apply_discount(10, 120)
''',
        "hidden": '''from shop.pricing import apply_discount


def test_discounted_price():
    assert apply_discount(200, 15) == 170.0


def test_zero_discount_keeps_price():
    assert apply_discount(19.99, 0) == 19.99
''',
        "f2p": ["tests/test_hidden.py::test_discounted_price", "tests/test_hidden.py::test_zero_discount_keeps_price"],
    },
    "duration": {
        "package": "timeparse", "module": "duration",
        "issue": "parse_duration('1h30m') returns 30, dropping the hours; it should return 90 (minutes). "
                 "'2h' alone and '45m' alone already work.",
        "source": '''"""Durations like '1h30m' or '45m', in minutes."""
import re

_PART = re.compile(r"(\\d+)([hm])")


def parse_duration(text: str) -> int:
    parts = _PART.findall(text.strip().lower())
    if not parts or "".join(n + u for n, u in parts) != text.strip().lower():
        raise ValueError(f"not a duration: {text!r}")
    minutes = 0
    for number, unit in parts:
        minutes += int(number) * (60 if unit == "h" else 1)
    return minutes
''',
        "bug": [("        minutes += int(number) * (60 if unit == \"h\" else 1)",
                 "        minutes = int(number) * (60 if unit == \"h\" else 1)")],
        "visible": '''import pytest

from timeparse.duration import parse_duration


def test_hours():
    assert parse_duration("2h") == 120


def test_minutes():
    assert parse_duration("45m") == 45


def test_garbage():
    with pytest.raises(ValueError):
        parse_duration("soon")
''',
        "hidden": '''from timeparse.duration import parse_duration


def test_hours_and_minutes():
    assert parse_duration("1h30m") == 90


def test_uppercase_mixed():
    assert parse_duration("3H5M") == 185
''',
        "f2p": ["tests/test_hidden.py::test_hours_and_minutes", "tests/test_hidden.py::test_uppercase_mixed"],
    },
    "lru": {
        "package": "cachekit", "module": "lru",
        "issue": "LRUCache evicts the wrong entry: after reading a key with get(), that key should count as "
                 "recently used, but it is still the first one evicted.",
        "source": '''"""A small least-recently-used cache."""
from collections import OrderedDict


class LRUCache:
    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._data: OrderedDict = OrderedDict()

    def get(self, key, default=None):
        if key not in self._data:
            return default
        self._data.move_to_end(key)
        return self._data[key]

    def put(self, key, value) -> None:
        self._data[key] = value
        self._data.move_to_end(key)
        while len(self._data) > self.capacity:
            self._data.popitem(last=False)

    def __len__(self) -> int:
        return len(self._data)
''',
        "bug": [("            return default\n        self._data.move_to_end(key)\n", "            return default\n")],
        "visible": '''from cachekit.lru import LRUCache


def test_put_get():
    cache = LRUCache(2)
    cache.put("a", 1)
    assert cache.get("a") == 1
    assert cache.get("zzz") is None


def test_capacity():
    cache = LRUCache(2)
    for key in "abc":
        cache.put(key, key)
    assert len(cache) == 2 and cache.get("a") is None
''',
        "hidden": '''from cachekit.lru import LRUCache


def test_get_refreshes_recency():
    cache = LRUCache(2)
    cache.put("a", 1)
    cache.put("b", 2)
    cache.get("a")
    cache.put("c", 3)
    assert cache.get("a") == 1 and cache.get("b") is None
''',
        "f2p": ["tests/test_hidden.py::test_get_refreshes_recency"],
    },
}
HIDDEN = ["tests/test_hidden.py"]
PYPROJECT = '[project]\nname = "{name}"\nversion = "0.1.0"\n\n[tool.pytest.ini_options]\ntestpaths = ["tests"]\n'


def buggy(spec: dict) -> str:
    text = spec["source"]
    for old, new in spec["bug"]:
        assert old in text, (spec["package"], old)
        text = text.replace(old, new, 1)
    return text


def fix_of(task_id: str) -> dict:
    """What fixes the bug: {path, old, new} (used by the honest scripted model, never shown to a real one)."""
    spec = REPOS[task_id]
    return {"path": f"{spec['package']}/{spec['module']}.py", "old": buggy(spec), "new": spec["source"]}


def _fingerprint() -> str:
    return hashlib.sha256(json.dumps(REPOS, sort_keys=True).encode()).hexdigest()[:12]


def repos_root() -> Path:
    override = os.environ.get("AGL_CODING_REPOS")
    if override:
        return Path(override)
    return Path.home() / ".cache" / "agl" / "coding-repos" / _fingerprint()


def _git(cwd: Path, *args: str) -> None:
    subprocess.run(["git", "-c", "user.name=agl", "-c", "user.email=agl@example.invalid", "-c", "init.defaultBranch=main",
                    *args], cwd=cwd, check=True, capture_output=True)


def _build(task_id: str, target: Path) -> None:
    spec = REPOS[task_id]
    package, module = spec["package"], spec["module"]
    files = {
        "pyproject.toml": PYPROJECT.format(name=package),
        f"{package}/__init__.py": "",
        f"{package}/{module}.py": spec["source"],
        f"tests/test_{module}.py": spec["visible"],
        "tests/test_hidden.py": spec["hidden"],
        "README.md": f"# {package}\n\nA tiny package. Run the tests with `python -m pytest`.\n",
    }
    for rel, text in files.items():
        (target / rel).parent.mkdir(parents=True, exist_ok=True)
        (target / rel).write_text(text)
    _git(target, "init", "-q")
    _git(target, "add", "-A")
    _git(target, "commit", "-q", "-m", f"{package}: first version")
    (target / f"{package}/{module}.py").write_text(buggy(spec))
    _git(target, "commit", "-q", "-am", f"{package}: simplify {module}")


def ensure_repo(task_id: str) -> Path:
    """The original repository of a task (git history and hidden tests included), built once; safe in parallel."""
    root = repos_root()
    target = root / task_id
    if (target / ".git").is_dir():
        return target
    root.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{task_id}-", dir=root))
    _build(task_id, staging)
    try:
        staging.rename(target)
    except OSError:  # another rollout built it first
        shutil.rmtree(staging, ignore_errors=True)
    return target


def task_line(task_id: str) -> dict:
    spec = REPOS[task_id]
    module = spec["module"]
    visible = [f"tests/test_{module}.py"]
    p2p = [f"tests/test_{module}.py"] + [f"tests/test_hidden.py::{name}" for name in _hidden_names(spec)
                                         if f"tests/test_hidden.py::{name}" not in spec["f2p"]]
    return {"id": task_id, "repo": task_id, "issue": spec["issue"], "visible_tests": visible, "hidden_tests": HIDDEN,
            "fail_to_pass": spec["f2p"], "pass_to_pass": p2p}


def _hidden_names(spec: dict) -> list[str]:
    return [line[4:].split("(")[0] for line in spec["hidden"].splitlines() if line.startswith("def test_")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--where", action="store_true", help="print where the repositories live")
    args = parser.parse_args()
    if args.where:
        print(repos_root())
        return
    (HERE / "tasks.jsonl").write_text("".join(json.dumps(task_line(t)) + "\n" for t in REPOS))
    for task_id in REPOS:
        print(ensure_repo(task_id))


if __name__ == "__main__":
    main()
