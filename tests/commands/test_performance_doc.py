"""docs/performance.md quotes committed `ninfer bench` reports: every report it names exists
(Markdown and JSON) and every figure quoted from one is what that report's table says."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "performance.md"
RESULTS = ROOT / "bench" / "results"


def _table(report: str) -> list[dict[str, str]]:
    """The rows of a report's table, as {column header: cell}."""
    lines = [x for x in (RESULTS / f"{report}.md").read_text().splitlines() if x.startswith("|")]
    head = [c.strip() for c in lines[0].strip("|").split("|")]
    return [dict(zip(head, (c.strip() for c in x.strip("|").split("|")))) for x in lines[2:]]


def _target_rows() -> list[str]:
    text = DOC.read_text()
    rows = [x for x in text.splitlines() if x.startswith("| ") and "`" in x]
    assert rows, "docs/performance.md has no table of figures"
    return rows


def test_named_reports_exist() -> None:
    names = {n for row in _target_rows() for n in re.findall(r"`([\w.-]+)`", row)}
    assert names
    for name in names:
        for ext in ("md", "json"):
            assert (RESULTS / f"{name}.{ext}").exists(), f"bench/results/{name}.{ext}"


def test_quoted_figures_match_their_reports() -> None:
    checked = 0
    for row in _target_rows():
        cells = [c.strip() for c in row.strip("|").split("|")]
        quoted = re.match(r"([\d,]+\.\d+) (tok/s|%|ms) \(`([\w.-]+)`\)", cells[1])
        if not quoted:
            continue
        value, unit, report = float(quoted[1].replace(",", "")), quoted[2], quoted[3]
        column = {"tok/s": "decode tok/s", "%": "prefill/matmul", "ms": "host ms/step"}[unit]
        found = [float(r[column].rstrip("%")) for r in _table(report)]
        assert any(abs(f - value) <= 0.01 for f in found), (report, column, value, found)
        checked += 1
    assert checked >= 6


def test_results_keep_stable_names_and_one_history() -> None:
    """bench/results holds the newest report of each configuration under a stable name (no
    per-session copies such as `-s13`), each as Markdown and JSON; every earlier report is a
    row of HISTORY.md, so each report docs/performance-log.md names is current or there."""
    reports = {p.stem for p in RESULTS.glob("*.md")} - {"HISTORY"}
    per_session = sorted(n for n in reports if re.search(r"-s\d+[a-z]?$", n))
    assert not per_session, f"per-session reports in bench/results: {per_session}"
    for name in reports:
        assert (RESULTS / f"{name}.json").exists(), f"bench/results/{name}.json"
    history = (RESULTS / "HISTORY.md").read_text()
    retired = set(re.findall(r"^\| [\d-]+ \| [0-9a-f]{7,} \| `([\w.-]+)`", history, re.MULTILINE))
    assert len(retired) >= 50
    renamed = dict(re.findall(r"^\| `([\w.-]+)` \| `([\w.-]+)` \|", history, re.MULTILINE))
    assert set(renamed) <= reports, "HISTORY.md lists a current report that does not exist"
    retired |= set(renamed.values())
    log = (ROOT / "docs" / "performance-log.md").read_text()
    named = set(re.findall(r"`(qwen3[\w.-]*)`", log))
    assert named
    unknown = sorted(named - reports - retired)
    assert not unknown, f"docs/performance-log.md names reports found nowhere: {unknown}"
