"""The HTML report in a real browser (headless Chromium, JavaScript never needed): it paints something on a
desktop and on a phone-sized window, its plots are SVG elements in the DOM, and the console stays silent (a
Content Security Policy violation, i.e. any attempt to load something, would show up there).

Skips when /usr/bin/chromium is missing; CI installs it (`apt-get install -y chromium chromium-driver`).
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import zlib
from pathlib import Path

import pytest

from agl_cli.report import write_report
from tests.helpers.make_runs import make_eval_run, make_study_run

CHROMIUM = Path("/usr/bin/chromium")
pytestmark = pytest.mark.skipif(not CHROMIUM.exists(), reason="headless Chromium is not installed at /usr/bin/chromium "
                                "(apt-get install -y chromium chromium-driver)")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--disable-quic", "--enable-logging=stderr", "--v=0",
         "--hide-scrollbars"]


def chromium(page: Path, profile: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(CHROMIUM), *FLAGS, f"--user-data-dir={profile}", *extra, page.as_uri()],
                          capture_output=True, text=True, timeout=60, check=False)


def _unfilter(raw: bytes, width: int, height: int, bpp: int) -> list[bytearray]:
    """PNG scanline filters undone (None, Sub, Up, Average, Paeth): the rows of raw bytes."""
    stride = width * bpp
    rows: list[bytearray] = []
    prev = bytearray(stride)
    pos = 0
    for _ in range(height):
        kind, line = raw[pos], bytearray(raw[pos + 1:pos + 1 + stride])
        pos += 1 + stride
        for i in range(stride):
            left = line[i - bpp] if i >= bpp else 0
            up, corner = prev[i], (prev[i - bpp] if i >= bpp else 0)
            if kind == 1:
                line[i] = (line[i] + left) & 255
            elif kind == 2:
                line[i] = (line[i] + up) & 255
            elif kind == 3:
                line[i] = (line[i] + ((left + up) >> 1)) & 255
            elif kind == 4:
                p = left + up - corner
                pa, pb, pc = abs(p - left), abs(p - up), abs(p - corner)
                line[i] = (line[i] + (left if pa <= pb and pa <= pc else up if pb <= pc else corner)) & 255
        rows.append(line)
        prev = line
    return rows


def png_gray(path: Path) -> list[int]:
    """Grey levels of an 8-bit, non-interlaced PNG, decoded with zlib alone (no Pillow needed)."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat, header = 8, b"", b""
    while pos < len(data):
        length = int.from_bytes(data[pos:pos + 4], "big")
        kind, body = data[pos + 4:pos + 8], data[pos + 8:pos + 8 + length]
        pos += 12 + length
        if kind == b"IHDR":
            header = body
        elif kind == b"IDAT":
            idat += body
    width, height = int.from_bytes(header[0:4], "big"), int.from_bytes(header[4:8], "big")
    depth, colour, interlace = header[8], header[9], header[12]
    assert depth == 8 and interlace == 0 and colour in (0, 2, 4, 6), "only 8-bit non-interlaced PNGs are read"
    bpp = {0: 1, 2: 3, 4: 2, 6: 4}[colour]
    rows = _unfilter(zlib.decompress(idat), width, height, bpp)
    if colour in (0, 4):
        return [row[i] for row in rows for i in range(0, len(row), bpp)]
    # Pillow's own RGB -> L conversion (ITU-R 601-2 luma, fixed point), so both paths give the same numbers.
    return [(row[i] * 19595 + row[i + 1] * 38470 + row[i + 2] * 7471 + 0x8000) >> 16
            for row in rows for i in range(0, len(row), bpp)]


def grey_levels(path: Path) -> list[int]:
    try:
        from PIL import Image
    except ImportError:
        return png_gray(path)
    with Image.open(path) as image:
        return list(image.convert("L").tobytes())  # one byte a pixel in mode L


def assert_painted(path: Path) -> None:
    levels = grey_levels(path)
    assert statistics.pstdev(levels) > 10, f"{path.name} looks blank"
    ink = sum(1 for v in levels if v < 200) / len(levels)
    assert ink > 0.01, f"{path.name}: only {ink:.2%} of the pixels are not background"


@pytest.fixture(scope="module")
def pages(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("browser")
    study = write_report(make_study_run(root), ("html",))[0]
    single = write_report(make_eval_run(root), ("html",))[0]
    return {"study": study, "eval": single}


def test_the_study_report_paints_on_desktop_and_phone_with_its_plots_and_no_console_errors(pages, tmp_path: Path) -> None:
    page = pages["study"]
    desktop, phone = tmp_path / "desktop.png", tmp_path / "phone.png"
    shot = chromium(page, tmp_path / "p1", f"--screenshot={desktop}", "--window-size=1280,2400", "--dump-dom")
    assert desktop.is_file(), shot.stderr[-2000:]
    dom = shot.stdout
    assert dom.count("<svg") == 4 and dom.count("<details") >= 8 and "<polygon" in dom and "<circle" in dom
    assert "Accuracy vs cost per task" in dom and "is better than the baseline" in dom
    console = [line for line in shot.stderr.splitlines() if ":CONSOLE" in line]
    assert console == [], console
    assert_painted(desktop)
    small = chromium(page, tmp_path / "p2", f"--screenshot={phone}", "--window-size=390,844")
    assert phone.is_file(), small.stderr[-2000:]
    assert [line for line in small.stderr.splitlines() if ":CONSOLE" in line] == []
    assert_painted(phone)
    if "PIL" in sys.modules:  # the zlib decoder, used where Pillow is missing, agrees with Pillow
        assert png_gray(phone)[::997] == grey_levels(phone)[::997]


def test_the_single_variant_report_paints_without_plots_of_one_point(pages, tmp_path: Path) -> None:
    shot_path = tmp_path / "eval.png"
    shot = chromium(pages["eval"], tmp_path / "p", f"--screenshot={shot_path}", "--window-size=1024,1600", "--dump-dom")
    dom = shot.stdout
    # a Pareto plot of one variant says nothing: the reward and latency distributions and the spend curves instead
    assert dom.count("<svg") == 4 and "Accuracy vs cost" not in dom
    assert "<title>Rewards" in dom and "<title>Rollout latency" in dom and "<title>Cumulative cost" in dom
    assert [line for line in shot.stderr.splitlines() if ":CONSOLE" in line] == []
    assert_painted(shot_path)
