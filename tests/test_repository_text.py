"""The repository speaks of the product, not of how it is made: no text file that ships in a
checkout (documents, code, configs, scripts, tests) refers to tickets by number, to who checked
whose work, or to how the developers borrow a machine. A user can neither see nor use any of it."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TEXT_SUFFIXES = {".md", ".py", ".yaml", ".yml", ".toml", ".cff", ".txt", ".sh", ".sbatch", ".cfg", ".ini"}
SKIPPED_DIRS = {".git", ".venv", "runs", "build", "dist", "outputs", "lightning_logs", "__pycache__", ".pytest_cache"}

DEVELOPMENT_TALK = {
    "a ticket number": re.compile(r"\bissues?\s+#?\d+", re.I),
    "a reviewer": re.compile(r"\bthe\s+reviewer", re.I),
    "a file list for a borrowed machine": re.compile(r"\bcarry\s*[:=]\s*\[|\bcarry(ing)?\s+[\"']?\.whl", re.I),
    "a borrowed machine's time limit": re.compile(r"\btimeout_[s]\b"),
    "a borrowed machine": re.compile(r"\bdevice\s+(call|machine|run)s?\b|\blent\s+to\b", re.I),
}


def text_files() -> list[Path]:
    """Every text file of the checkout but this one, whose examples are the words it looks for
    (configs/ is a link to locatdino/configs/, read once)."""
    found = []
    for path in ROOT.rglob("*"):
        rel = path.relative_to(ROOT)
        if (
            any(part in SKIPPED_DIRS or part.endswith(".egg-info") for part in rel.parts)
            or path.is_symlink()
            or path == Path(__file__).resolve()
        ):
            continue
        if path.is_file() and (path.suffix in TEXT_SUFFIXES or path.name in {"LICENSE", "run"}):
            found.append(path)
    return sorted(found)


def development_talk(path: Path) -> list[str]:
    hits = []
    for number, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
        for what, pattern in DEVELOPMENT_TALK.items():
            if match := pattern.search(line):
                hits.append(f"{path.relative_to(ROOT)}:{number}: {what} ({match.group(0)!r})")
    return hits


def test_the_patterns_catch_development_talk_and_spare_ordinary_prose():
    talk = [
        "fixed in issue 21",
        "see Issues #3 and 4",
        "the reviewer's run",
        "carry=['.whl']",
        'carry: [".whl"]',
        "timeout_s=570",
        "one device call",
        "this workplace's device machine",
        "no GPU was lent to this session",
        "did the call carry .whl?",
        "one device run carrying .whl",
    ]
    prose = [
        "the tokens carry their position",
        "a known issue with fp16",
        "timeout 480 s",
        "the device of the encoder",
        "calls on the device",
        "issue a warning",
    ]
    assert all(any(p.search(t) for p in DEVELOPMENT_TALK.values()) for t in talk)
    assert not any(p.search(t) for p in DEVELOPMENT_TALK.values() for t in prose)


def test_the_checkout_holds_the_front_page_and_its_documents():
    names = {str(p.relative_to(ROOT)) for p in text_files()}
    assert {
        "README.md",
        "benchmarks/RESULTS.md",
        "docs/README.md",
        "LICENSE",
        "CITATION.cff",
        "pyproject.toml",
    } <= names
    assert any(n.startswith("locatdino/") and n.endswith(".py") for n in names)


def test_no_text_file_speaks_of_how_the_project_is_developed():
    hits = [hit for path in text_files() for hit in development_talk(path)]
    assert not hits, "development talk in shipped text:\n" + "\n".join(hits)
