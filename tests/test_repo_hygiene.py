"""The repository stands on its own: no committed file points at a document outside it, or at a
path of the machine it was written on.

The contract and the design live in docs/serving.md and docs/design.md; a comment that cites a
file beside the checkout, or a hard-coded home or work directory, means nothing to a reader of a
fresh clone. The forbidden strings are assembled from pieces so that this file does not match
itself.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# What a committed file must not contain, and why (shown on failure).
FORBIDDEN: dict[str, re.Pattern[bytes]] = {
    "a path beside the checkout": re.compile(re.escape(b".." + b"/shared")),
    "the outside serving contract": re.compile(re.escape(b"spec/" + b"serving.md")),
    "an outside design note": re.compile(rb"\b(DESIGN|STYLE)" + rb"\.md\b|notes-" + rb"models\.md"),
    "the outside serving document": re.compile(rb"(?i)\bserving " + rb"spec(ification)?\b"),
    "an unnamed outside spec": re.compile(rb"(?i)\bthe " + rb"spec\b|\bspec" + rb"'s\b"),
    "a path of this machine": re.compile(rb"(?<![\w.$~-])/(work|root)" + rb"/"),
}
SKIP_SUFFIXES = (".ninfer", ".gguf", ".safetensors", ".png", ".jpg", ".cubin")


def tracked_files() -> list[Path]:
    """The files git tracks (untracked and ignored ones are not committed); without git (an
    unpacked archive), every file outside hidden folders and caches."""
    try:
        out = subprocess.run(
            ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True, timeout=60
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return [
            p
            for p in ROOT.rglob("*")
            if p.is_file()
            and not any(
                part.startswith(".") or part == "__pycache__" for part in p.parts[len(ROOT.parts) :]
            )
        ]
    return [ROOT / name.decode() for name in out.split(b"\0") if name]


def offences(path: Path) -> list[str]:
    """`line N: why` for every forbidden string in `path` (binary formats are skipped)."""
    if path.suffix in SKIP_SUFFIXES or not path.is_file():
        return []
    found = []
    for n, line in enumerate(path.read_bytes().splitlines(), 1):
        for why, pattern in FORBIDDEN.items():
            if pattern.search(line):
                found.append(f"line {n}: {why}: {line.strip()[:120].decode(errors='replace')}")
    return found


def test_the_patterns_catch_what_they_are_for(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    samples = [
        "# see " + ".." + "/shared/notes",
        "# contract: spec/" + "serving.md",
        '"""As DESIGN' + '.md says."""',
        "# the serving " + "specification requires it",
        "# as the " + "spec says",
        "cache = '/" + "root/.cache/ninfer'",
        "out = '/" + "work/main/x'",
    ]
    bad.write_text("\n".join(samples) + "\n")
    assert len(offences(bad)) == len(samples)
    fine = tmp_path / "fine.py"
    fine.write_text(
        "spec = ModelSpec()  # a variable\n"
        "# docs/serving.md, 'Server options'\n"
        "url = 'http://127.0.0.1/v1/models'\n"
        "cache = '$NINFER_CACHE/root/x'; home = '~/work/y'\n"
    )
    assert offences(fine) == []


def test_no_committed_file_points_outside_the_repository() -> None:
    files = tracked_files()
    assert len(files) > 100, f"found only {len(files)} files under {ROOT}"
    report = [f"{p.relative_to(ROOT)} {o}" for p in files for o in offences(p)]
    assert not report, "\n".join(report)


# A section reference: docs/serving.md or docs/design.md followed by quoted headings (also split
# over comment lines, or several joined by "and"); each must be a heading of that document.
SECTION_REFERENCE = re.compile(
    r"docs/(serving|design)\.md(?:'s)?,?[\s#]*\(?((?:[\s#]*(?:,|and)?[\s#]*\"[A-Z][^\"]{2,60}\")+)"
)


def test_section_references_name_real_headings() -> None:
    headings = {
        doc: {
            " ".join(h.split())
            for h in re.findall(
                r"^#+ (.+)$", (ROOT / "docs" / f"{doc}.md").read_text(), re.MULTILINE
            )
        }
        for doc in ("serving", "design")
    }
    checked, wrong = 0, []
    for path in tracked_files():
        if path.suffix not in (".py", ".md", ".toml") or not path.is_file():
            continue
        for m in SECTION_REFERENCE.finditer(path.read_text(encoding="utf-8", errors="replace")):
            for name in re.findall(r"\"([^\"]+)\"", m.group(2)):
                name = " ".join(name.replace("#", " ").split())
                checked += 1
                if name not in headings[m.group(1)]:
                    wrong.append(f"{path.relative_to(ROOT)}: docs/{m.group(1)}.md has no {name!r}")
    assert checked >= 20, checked
    assert not wrong, "\n".join(wrong)
