"""The docs say what the repository holds (issue 15, item 19).

- A fenced YAML block that names a file (a ``<!-- same as: PATH -->`` line right before it, or
  a first line ``name: STEM`` for an SLA file ``objectives/STEM.yaml``) holds the same values as
  that file: comments and flow style may differ, the parsed YAML may not.
- Every repository path that .ci/run or a doc names (a link, or a path such as
  ``objectives/quickstart-cpu.yaml`` in the text) exists.
- objectives/README.md links every SLA file of its folder.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
OBJECTIVES = ROOT / "objectives"

# The docs a user reads; docs/examples/ holds copies of generated bundles, whose paths are the
# bundle's own.
DOCS = [
    ROOT / "README.md",
    *sorted(p for p in (ROOT / "docs").rglob("*.md") if "examples" not in p.parts),
    *sorted(ROOT.glob("*/README.md")),
]

_FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)
_SAME_AS = re.compile(r"<!--\s*same as:\s*(\S+)\s*-->\s*$")
_LINK = re.compile(r"\]\(([^)\s#]+)(?:#[^)]*)?\)")
# A path into one of the repository's top-level folders, not part of a longer path or URL
# (trials/ holds what runs write: its paths are outputs).
_PATH = re.compile(
    r"(?<![\w/.$-])((?:autotuner|tests|objectives|docs|deploy|benchmarks|search_spaces|\.ci)"
    r"/[\w./-]*\w)"
)
# Paths the docs name that are not this repository's.
FOREIGN = {"benchmarks/auto_tune"}  # vLLM's own auto_tune folder


def _snippets(doc: Path) -> Iterator[tuple[Path, str, int]]:
    """(file it names, YAML text, line) of every fenced YAML block of ``doc`` that names one."""
    text = doc.read_text(encoding="utf-8")
    for m in _FENCE.finditer(text):
        if m.group(1) not in ("yaml", "yml"):
            continue
        line = text.count("\n", 0, m.start()) + 1
        before = text[: m.start()].rstrip("\n").rsplit("\n", 1)[-1]
        marker = _SAME_AS.search(before)
        if marker:
            yield ROOT / marker.group(1), m.group(2), line
            continue
        first = re.match(r"name:\s*([\w.-]+)\s*(?:#.*)?$", m.group(2).split("\n", 1)[0])
        if first and (OBJECTIVES / f"{first.group(1)}.yaml").is_file():
            yield OBJECTIVES / f"{first.group(1)}.yaml", m.group(2), line


def _load(text: str) -> Any:
    return yaml.safe_load(text)


def test_snippets_that_name_a_file_hold_its_values() -> None:
    found = [(doc, *s) for doc in DOCS for s in _snippets(doc)]
    readme = [f for doc, f, _, _ in found if doc.name == "README.md" and doc.parent == ROOT]
    assert OBJECTIVES / "quickstart-cpu.yaml" in readme, "the README's SLA snippet is not found"
    for doc, path, snippet, line in found:
        where = f"{doc.relative_to(ROOT)}:{line}"
        assert path.is_file(), f"{where}: names {path}, which does not exist"
        assert _load(snippet) == _load(path.read_text(encoding="utf-8")), (
            f"{where}: the snippet's values differ from {path.relative_to(ROOT)}"
        )


def _named_paths(doc: Path) -> Iterator[tuple[str, bool]]:
    """(path, whether it exists) for every link and repository path ``doc`` names; a path may
    be relative to the repository or to the doc's folder."""
    text = doc.read_text(encoding="utf-8")
    for link in _LINK.findall(text):
        if not re.match(r"[a-z]+:", link):  # not a URL
            yield link, (doc.parent / link).exists()
    for path in _PATH.findall(text):
        if path not in FOREIGN:
            yield path, (ROOT / path).exists() or (doc.parent / path).exists()


def test_every_path_the_ci_script_and_the_docs_name_exists() -> None:
    missing = [
        f"{doc.relative_to(ROOT)}: {path}"
        for doc in [ROOT / ".ci" / "run", *DOCS]
        for path, exists in _named_paths(doc)
        if not exists
    ]
    assert missing == []


def test_the_ci_script_names_paths_this_test_sees() -> None:
    named = {p for p, _ in _named_paths(ROOT / ".ci" / "run")}
    assert "tests/unit/cli/test_cli.py" in named  # where the README/CI command check lives
    assert "tests/unit/daemon/test_alerting.py" in named


def test_objectives_readme_lists_every_sla_file() -> None:
    readme = OBJECTIVES / "README.md"
    linked = {link for link in _LINK.findall(readme.read_text(encoding="utf-8"))}
    files = {p.name for p in OBJECTIVES.glob("*.yaml")}
    assert files, "no SLA file in objectives/"
    assert files - linked == set(), "SLA files objectives/README.md does not list"
    assert {f for f in linked if f.endswith(".yaml")} <= files
