"""The user docs hold together: every link and every repository path they name exists.

Checked: README.md, CHANGELOG.md and docs/*.md (relative links and their anchors, repository
paths anywhere in the text), the code's docstrings and comments (repository paths, and
``docs/storage.md §N.M`` citations against that page's numbered sections), and the Kafka
compatibility page's table of served APIs against what the Kafka listener's ApiVersions lists.
"""

from __future__ import annotations

import ast
import functools
import io
import re
import tokenize
from collections.abc import Iterator
from pathlib import Path

import pytest

from replication.kafka.wire import SASL_VERSIONS, SERVED_VERSIONS

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parent.parent
DOCS = sorted((ROOT / "docs").glob("*.md"))
PAGES = [ROOT / "README.md", ROOT / "CHANGELOG.md", *DOCS]
CODE_DIRS = ("logstore", "replication", "datasource", "tests", "benchmarks", "examples")

#: a path that starts at one of the repository's top-level folders, e.g. conf/broker.toml
_TOP_DIRS = r"(?:logstore|replication|datasource|tests|benchmarks|conf|examples|docs|docker|\.ci)"
_DIR_PATH = re.compile(rf"(?<![\w./<>-]){_TOP_DIRS}/[\w./-]*[\w/]")
#: the repository's top-level files, and any *.md name (a doc page, wherever it is cited)
_TOP_FILE = re.compile(
    r"(?<![\w./<>-])(?:LICENSE|Dockerfile|pyproject\.toml|pyspark_replog\.py"
    r"|docker-compose[\w.-]*\.yml|[\w-]+\.md)(?![\w/-])"
)
#: Markdown links [text](target), outside code
_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
_FENCE = re.compile(r"^```.*?^```", re.S | re.M)
_CODE_SPAN = re.compile(r"`[^`\n]*`")
#: a citation of a numbered section of the storage page
_STORAGE_CITE = re.compile(r"docs/storage\.md((?:,? ?§\d+(?:\.\d+)?(?:-\d+(?:\.\d+)?)?)+)")
#: words about how the project was made, not what it is
_HISTORY = re.compile(r"\bsessions? \d|\bissue \d|\.\./shared|lab notebook", re.I)
#: external links and things that look like paths but name no repository file
_EXTERNAL = ("http://", "https://", "mailto:")


def _slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[`*]", "", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    seen: dict[str, int] = {}
    anchors = set()
    for line in _FENCE.sub("", page.read_text()).splitlines():
        match = re.match(r"#{1,6} (.+)", line)
        if not match:
            continue
        slug = _slug(match.group(1))
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        anchors.add(slug if count == 0 else f"{slug}-{count}")
    return anchors


def _links(page: Path) -> Iterator[str]:
    prose = _CODE_SPAN.sub("", _FENCE.sub("", page.read_text()))
    for match in _LINK.finditer(prose):
        yield match.group(1)


def _paths(text: str) -> Iterator[str]:
    for match in _DIR_PATH.finditer(text):
        yield match.group(0).rstrip(".")
    for match in _TOP_FILE.finditer(text):
        yield match.group(0)


def _exists(path: str, relative_to: Path) -> bool:
    """A repository path exists: from the root, or (a bare *.md name) in docs/. A placeholder
    (``examples/NAME.py``) names no file; ``tests/cluster.Cluster`` names a module's class."""
    stem = path.rstrip("/").rsplit("/", 1)[-1].split(".")[0]
    if "/" in path and stem.isupper():
        return True
    path = re.sub(r"\.[A-Z]\w*$", ".py", path)
    candidates = [ROOT / path, relative_to / path]
    if path.endswith(".md") and "/" not in path:
        candidates.append(ROOT / "docs" / path)
    return any(c.exists() for c in candidates)


def _code_files() -> Iterator[Path]:
    yield ROOT / "pyspark_replog.py"
    for folder in CODE_DIRS:
        yield from sorted((ROOT / folder).rglob("*.py"))


@functools.cache
def _prose_of_code(path: Path) -> tuple[tuple[int, str], ...]:
    """(line, text) of every comment and docstring of a Python file."""
    return tuple(_walk_prose(path.read_text()))


def _walk_prose(source: str) -> Iterator[tuple[int, str]]:
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            yield token.start[0], token.string
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            doc = ast.get_docstring(node, clean=False)
            if doc and node.body:
                yield node.body[0].lineno, doc


def dangling_links(page: Path) -> list[str]:
    """The links of a page that name no file, or no heading of the file they name."""
    bad = []
    for target in _links(page):
        if target.startswith(_EXTERNAL):
            continue
        file_part, _, anchor = target.partition("#")
        file = (page.parent / file_part).resolve() if file_part else page
        if not file.exists():
            bad.append(f"{page.name}: link to {target}: no file {file_part}")
        elif anchor and file.suffix == ".md" and anchor not in _anchors(file):
            bad.append(f"{page.name}: link to {target}: {file.name} has no heading #{anchor}")
    return bad


def dangling_paths(text: str, where: str, relative_to: Path) -> list[str]:
    return [
        f"{where}: names {path}, which does not exist"
        for path in _paths(text)
        if not _exists(path, relative_to)
    ]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_link_of_a_page_resolves(page: Path) -> None:
    assert dangling_links(page) == []


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_repository_path_a_page_names_exists(page: Path) -> None:
    assert dangling_paths(page.read_text(), page.name, page.parent) == []


def test_every_repository_path_the_code_names_exists() -> None:
    bad = []
    for path in _code_files():
        for line, text in _prose_of_code(path):
            bad += dangling_paths(text, f"{path.relative_to(ROOT)}:{line}", path.parent)
    assert bad == []


def test_storage_citations_name_sections_of_docs_storage() -> None:
    storage = (ROOT / "docs/storage.md").read_text()
    headings = {m.group(1) for m in re.finditer(r"^#{2,3} (\d+(?:\.\d+)?)\.? ", storage, re.M)}
    bad = []
    for path in _code_files():
        for line, text in _prose_of_code(path):
            for cite in _STORAGE_CITE.finditer(" ".join(text.split())):
                for number in re.findall(r"\d+(?:\.\d+)?", cite.group(1)):
                    if number not in headings:
                        bad.append(f"{path.relative_to(ROOT)}:{line}: docs/storage.md §{number}")
    assert headings
    assert bad == []


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_pages_say_what_is_not_how_it_was_made(page: Path) -> None:
    found = [m.group(0) for m in _HISTORY.finditer(page.read_text())]
    assert found == []


def test_readme_stays_short() -> None:
    assert len((ROOT / "README.md").read_text().splitlines()) <= 400


def test_the_served_api_table_is_what_api_versions_lists() -> None:
    page = (ROOT / "docs/kafka-compatibility.md").read_text()
    section = page.split("## Served APIs", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| (\w+) \| (\d+) \| (\d+)(?:\u2013(\d+))? \|", section, re.M)
    table = {int(key): (int(lo), int(hi or lo)) for _, key, lo, hi in rows}
    served = {int(k): v for k, v in {**SERVED_VERSIONS, **SASL_VERSIONS}.items()}
    assert table == served
    names = {int(key): name for name, key, _, _ in rows}
    assert names == {int(k): k.kafka_name for k in {**SERVED_VERSIONS, **SASL_VERSIONS}}


def test_a_dangling_link_or_path_is_found(tmp_path: Path) -> None:
    """The checks above would fail: a missing file, a missing anchor and a missing path."""
    page = tmp_path / "page.md"
    page.write_text(
        "# Title\n\nSee [the guide](missing.md), [here](#title), [there](#nowhere) and "
        "`benchmarks/no_such_benchmark.py`, `conf/broker.toml`, `docs/storage.md`, "
        "`<broker-root>/_replog/wal/L0/<seq>.wal`, `logstore/*.py`, `examples/NAME.py`, "
        "`tests/cluster.Cluster`.\n"
    )
    assert dangling_links(page) == [
        "page.md: link to missing.md: no file missing.md",
        "page.md: link to #nowhere: page.md has no heading #nowhere",
    ]
    assert dangling_paths(page.read_text(), "page.md", tmp_path) == [
        "page.md: names benchmarks/no_such_benchmark.py, which does not exist",
        "page.md: names missing.md, which does not exist",
    ]
