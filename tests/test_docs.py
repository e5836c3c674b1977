"""The user-facing notes stay reachable: every relative link of README.md, docs/ and RESULTS.md
points to a file of the repository and, with an anchor, to a heading of that file; and no shipped
text sends a user to notes they never have (the project's internal SPEC.md)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [
    ROOT / "README.md",
    ROOT / "benchmarks" / "README.md",
    ROOT / "benchmarks" / "RESULTS.md",
    ROOT / "benchmarks" / "results" / "README.md",
    *sorted((ROOT / "docs").glob("*.md")),
]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def github_anchor(heading: str) -> str:
    """The anchor GitHub gives a Markdown heading: lower case, punctuation dropped, spaces → '-'."""
    text = re.sub(r"`", "", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    body = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.S)
    return {github_anchor(m) for m in re.findall(r"^#+ (.+)$", body, flags=re.M)}


def test_github_anchor_rule():
    assert (
        github_anchor("Supervised pretraining (the LocAtViT paper's main recipe)")
        == "supervised-pretraining-the-locatvit-papers-main-recipe"
    )
    assert github_anchor("How sure is a difference?") == "how-sure-is-a-difference"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(page: Path):
    broken = []
    for target in LINK.findall(page.read_text(encoding="utf-8")):
        if re.match(r"[a-z]+:", target):  # http(s):, mailto:
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            broken.append(f"{target}: no file {dest.relative_to(ROOT) if dest.is_relative_to(ROOT) else dest}")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target}: no heading with anchor #{anchor}")
    assert not broken, f"{page.name}: " + "; ".join(broken)


RESULTS_CITATION = re.compile(r'RESULTS(?:\.md)?[,:]\s*"([^"]+)"')


def results_citations(text: str) -> list[str]:
    """Section names cited as ``RESULTS.md, "name"`` or ``RESULTS: "name"``, a name that wraps
    across comment or docstring lines read as one line."""
    return RESULTS_CITATION.findall(re.sub(r"\s*\n\s*#?\s*", " ", text))


def test_results_citation_rule():
    text = 'x (benchmarks/RESULTS.md, "How fast is\n    # data loading?"); RESULTS: "A b?" and RESULTS.md alone'
    assert results_citations(text) == ["How fast is data loading?", "A b?"]


def test_every_cited_results_section_exists():
    """Docstrings, comments, configs and pages that name a section of RESULTS.md name one it has."""
    results = ROOT / "benchmarks" / "RESULTS.md"
    headings = set(re.findall(r"^#+ (.+?)\s*$", results.read_text(encoding="utf-8"), flags=re.M))
    files = [
        p
        for folder in ("locatdino", "benchmarks", "docs", "tests", "launch")
        for p in ROOT.joinpath(folder).rglob("*")
        if p.suffix in {".py", ".md", ".yaml", ".sh"} and p.resolve() != Path(__file__).resolve()
    ]
    cited = {
        (str(p.relative_to(ROOT)), name)
        for p in [*files, ROOT / "README.md"]
        for name in results_citations(p.read_text(encoding="utf-8"))
    }
    assert len(cited) >= 5  # the search reads the citations there are
    stale = sorted(f"{path}: {name!r}" for path, name in cited if name not in headings)
    assert not stale, "cited sections that RESULTS.md does not have: " + "; ".join(stale)


def test_docs_are_linked_from_readme_index():
    index = (ROOT / "docs" / "README.md").read_text(encoding="utf-8")
    missing = [p.name for p in (ROOT / "docs").glob("*.md") if p.name != "README.md" and f"({p.name})" not in index]
    assert not missing, f"docs/README.md does not list {missing}"


def test_no_shipped_text_points_to_internal_notes():
    """Docstrings, configs and pages cite docs/ (which ships), not the developers' SPEC.md."""
    files = [
        *ROOT.joinpath("locatdino").rglob("*.py"),
        *ROOT.joinpath("locatdino").rglob("*.yaml"),
        *ROOT.joinpath("benchmarks").rglob("*.py"),
        *PAGES,
    ]
    cited = [
        f"{p.relative_to(ROOT)}:{i}"
        for p in files
        for i, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
        if re.search(r"SPEC ?§|SPEC\.md", line)
    ]
    assert not cited, f"references to the internal SPEC.md: {cited}"


def test_the_front_page_and_the_results_stay_short():
    """A newcomer reads README in five minutes; RESULTS holds one short section per question."""
    assert len((ROOT / "README.md").read_text(encoding="utf-8").splitlines()) <= 150
    assert len((ROOT / "benchmarks" / "RESULTS.md").read_text(encoding="utf-8").splitlines()) <= 400


def test_every_recorded_measurement_is_listed_and_names_its_command():
    results = ROOT / "benchmarks" / "results"
    index = (results / "README.md").read_text(encoding="utf-8")
    files = sorted(results.glob("*.json"))
    assert files and not [p.name for p in files if f"`{p.name}`" not in index]
    for path in files:
        record = json.loads(path.read_text(encoding="utf-8"))
        assert record.get("command"), f"{path.name}: no command"
