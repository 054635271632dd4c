"""The user documentation: every design reference names a section of docs/design.md, the old name of that
document is gone, links between the pages resolve, and the pages speak to users (no issue numbers, commit
hashes, clock times or words about the machine beyond its description)."""

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DESIGN = ROOT / "docs" / "design.md"
# where references to the design live: code, tests, benchmarks, docs, the container files
SOURCES = [
    *sorted((ROOT / "iolstream").rglob("*.py")),
    *sorted((ROOT / "tests").rglob("*.py")),
    *sorted((ROOT / "scripts").rglob("*.py")),
    *sorted((ROOT / "benchmarks").rglob("*.py")),
    *sorted((ROOT / "docs").glob("*.md")),
    *sorted((ROOT / "docker").rglob("*.*")),
    ROOT / "README.md",
    ROOT / "config" / "worker.yaml",
]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "docker" / "README.md"]
REFERENCE = re.compile(r"design\.md\s+§\s*(\d+)")


def design_sections() -> set[int]:
    return {int(m) for m in re.findall(r"^## (\d+)\. ", DESIGN.read_text(), flags=re.MULTILINE)}


def references() -> list[tuple[str, int, int]]:
    """(file, line, section) of every "docs/design.md §n" in the sources."""
    found = []
    for path in SOURCES:
        if not path.is_file() or path.suffix in {".png", ".iolsnap"}:
            continue
        text = path.read_text(errors="replace")
        for m in REFERENCE.finditer(text):
            found.append((str(path.relative_to(ROOT)), text.count("\n", 0, m.start()) + 1, int(m.group(1))))
    return found


def test_design_numbers_its_sections_one_to_thirteen():
    assert design_sections() == set(range(1, 14))


def test_every_design_reference_names_a_section_that_exists():
    refs = references()
    assert len(refs) > 30, "the code cites the design throughout; did the pattern change?"
    sections = design_sections()
    missing = [f"{path}:{line} cites §{n}" for path, line, n in refs if n not in sections]
    assert not missing, "sections not in docs/design.md: " + "; ".join(missing)


def test_no_reference_to_a_document_outside_the_repository():
    stale = []
    for path in SOURCES:
        if path.is_file() and path.suffix not in {".png", ".iolsnap"}:
            for i, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
                if re.search(r"\bSPEC\b|\bMEASUREMENTS\b", line):
                    stale.append(f"{path.relative_to(ROOT)}:{i}")
    assert not stale, "cite docs/design.md §n or docs/benchmarks.md instead: " + ", ".join(stale)


# what a lab notebook says and a user's guide does not
NOTEBOOK = [
    (r"\b(?:issue|PR|pull request)\s*#?\d+", "an issue number"),
    (r"(?<![\w/(])#\d{1,4}\b(?![\w-])", "an issue number"),
    (r"\b(?:commit|at)\s+`?[0-9a-f]{7,40}\b", "a commit hash"),
    (r"(?-i:\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*\d)[0-9a-f]{7,40}\b)", "a commit hash"),
    (r"\b[0-2]\d:[0-5]\d(?::[0-5]\d)?\s*(?:UTC|Z)\b", "a clock time"),
    (r"\bthis (?:sandbox|box|container session)\b", "words about the sandbox"),
    (r"\bsandbox\b", "words about the sandbox"),
    (r"\bload(?: average)? (?:of )?\d+(?:[–-]\d+)?\b", "the machine's load"),
    (r"\bother (?:engineers|sessions)\b", "words about the people working on it"),
]


# an upstream project's issue is a reference a user can follow: "librdkafka issues #5456 and #5511"
UPSTREAM_ISSUE = re.compile(
    r"\b(?:librdkafka|numba|kafka|confluent-kafka|river|scikit-learn|podman)\s+(?:issues?|PR)\s+"
    r"#?\d+(?:(?:,\s*|\s+and\s+)#?\d+)*",
    flags=re.IGNORECASE,
)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_pages_speak_to_users(page):
    hits = []
    for i, line in enumerate(page.read_text().splitlines(), 1):
        line = UPSTREAM_ISSUE.sub("", line)
        for pattern, what in NOTEBOOK:
            if re.search(pattern, line, flags=re.IGNORECASE):
                hits.append(f"line {i}: {what}: {line.strip()[:100]}")
    assert not hits, "\n".join(hits)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(page):
    broken = []
    for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text()):
        if "://" in target or target.startswith("mailto:"):
            continue
        if not (page.parent / target).exists():
            broken.append(target)
    assert not broken, f"{page.relative_to(ROOT)} links to missing files: {broken}"


def anchors(page: Path) -> set[str]:
    """The anchors GitHub makes of a page's headings: lower case, the inline markup (code, links) reduced to its
    text, what is not a letter, digit, space, hyphen or underscore dropped, spaces made hyphens; a repeated
    heading gets -1, -2, ...; plus explicit ``<a id="...">`` / ``<a name="...">``."""
    found, text = set(), page.read_text()
    text = re.sub(r"^```.*?^```", "", text, flags=re.MULTILINE | re.DOTALL)  # no headings inside code blocks
    for heading in re.findall(r"^#{1,6}\s+(.+?)\s*#*\s*$", text, flags=re.MULTILINE):
        heading = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # [text](link) -> text
        slug = re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")
        unique, n = slug, 0
        while unique in found:
            n += 1
            unique = f"{slug}-{n}"
        found.add(unique)
    found.update(re.findall(r"<a\s+(?:id|name)=\"([^\"]+)\"", text))
    return found


def links(page: Path) -> list[tuple[str, str]]:
    """(file, anchor) of every Markdown link of ``page`` to a page of this repository (file "" = the page
    itself; anchor "" = none), outside code blocks."""
    text = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.MULTILINE | re.DOTALL)
    out = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if "://" in target or target.startswith("mailto:"):
            continue
        file, _, anchor = target.partition("#")
        out.append((file, anchor))
    return out


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_links_and_their_anchors_resolve(page):
    """Every link to a file of the repository resolves, and so does its anchor (a heading of the page it names)."""
    broken = []
    for file, anchor in links(page):
        target = (page.parent / file) if file else page
        if not target.exists():
            broken.append(f"{file}: no such file")
        elif anchor and target.suffix == ".md" and anchor not in anchors(target):
            broken.append(f"{file}#{anchor}: no such heading in {target.relative_to(ROOT)}")
    assert not broken, f"{page.relative_to(ROOT)}: " + "; ".join(broken)


def test_the_anchor_rule_is_githubs():
    """The slugs of a few headings as GitHub renders them (checked by hand on rendered pages)."""
    page = ROOT / "docs" / "operations.md"
    got = anchors(page)
    for slug in (
        "before-the-first-run-iolstream-check",
        "secured-kafka",
        "message-size-limits-and-dead-letter-excerpts",
    ):
        assert slug in got, (slug, sorted(got)[:20])


BENCHMARKS = sorted((ROOT / "benchmarks").glob("*.py"))


@pytest.mark.parametrize("script", BENCHMARKS, ids=lambda p: p.name)
def test_each_benchmark_names_its_table_and_its_command(script):
    """A study in benchmarks/ regenerates a table of docs/benchmarks.md: its docstring's first line quotes that
    table's heading (its date left out), the docstring gives the command that runs it, and the page cites it."""
    page = (ROOT / "docs" / "benchmarks.md").read_text()
    headings = re.findall(r"^#{2,6}\s+(.+?)\s*$", page, flags=re.MULTILINE)
    doc = ast.get_docstring(ast.parse(script.read_text())) or ""
    quoted = re.search(r'"([^"]+)"', doc.split("\n\n")[0])
    assert quoted, f"{script.name}: the docstring's first line names no table in quotes"
    assert any(h.startswith(quoted.group(1)) for h in headings), (
        f'{script.name}: no heading "{quoted.group(1)}" in docs/benchmarks.md'
    )
    assert f"benchmarks/{script.name}" in doc, f"{script.name}: the docstring gives no command"
    assert f"benchmarks/{script.name}" in page, f"docs/benchmarks.md does not cite benchmarks/{script.name}"


def test_scripts_hold_what_operates_the_project():
    """scripts/ is for operating (the broker, the cluster, the images, the demo, a busy machine); studies live in
    benchmarks/."""
    studies = sorted(p.name for p in (ROOT / "scripts").glob("*.py"))
    assert not studies, f"move these studies to benchmarks/, each named after its table: {studies}"
