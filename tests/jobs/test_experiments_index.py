"""experiments/README.md's "Scripts" index names every script under experiments/ (one bullet each:
``- `folder/script.py` — what it does``) and nothing that is missing; the docs cite no experiments path that
does not exist. A script added without its index line fails the first test."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXPERIMENTS = ROOT / "experiments"
DOCS = [ROOT / "README.md", EXPERIMENTS / "README.md", EXPERIMENTS / "gpu" / "README.md"]


def scripts_on_disk() -> set[str]:
    """Every .py and .sh under experiments/, relative to it; package markers and caches left out."""
    return {path.relative_to(EXPERIMENTS).as_posix() for pattern in ("*.py", "*.sh")
            for path in EXPERIMENTS.rglob(pattern)
            if path.name != "__init__.py" and "__pycache__" not in path.parts}


def index_entries() -> list[str]:
    """The paths the index's bullets start with, in order."""
    text = (EXPERIMENTS / "README.md").read_text()
    match = re.search(r"^## Scripts\n(.*?)(?=^## )", text, flags=re.S | re.M)
    assert match, "experiments/README.md has no '## Scripts' section"
    return re.findall(r"^- `([\w./-]+\.(?:py|sh))` — ", match.group(1), flags=re.M)


def test_index_lists_every_script_and_no_missing_one():
    listed = index_entries()
    on_disk = scripts_on_disk()
    unlisted = sorted(on_disk - set(listed))
    missing = sorted(set(listed) - on_disk)
    assert not unlisted, f"scripts under experiments/ without a line in experiments/README.md's index: {unlisted}"
    assert not missing, f"experiments/README.md's index names scripts that do not exist: {missing}"
    assert len(listed) == len(set(listed)), "a script is listed twice in experiments/README.md's index"


@pytest.mark.parametrize("doc", DOCS, ids=lambda path: path.relative_to(ROOT).as_posix())
def test_docs_cite_only_existing_experiments_paths(doc):
    cited = set(re.findall(r"experiments/[\w./-]*\w\.(?:py|sh|md)\b", doc.read_text()))
    missing = sorted(path for path in cited if not (ROOT / path).is_file())
    assert not missing, f"{doc.relative_to(ROOT)} cites experiments paths that do not exist: {missing}"


def test_links_to_studies_reach_an_anchor():
    """The question index and README.md link studies by anchor (``<a id="...">`` above each study)."""
    text = (EXPERIMENTS / "README.md").read_text()
    anchors = set(re.findall(r'<a id="([\w-]+)"></a>', text))
    linked = set(re.findall(r"\]\(#([\w-]+)\)", text))
    linked |= set(re.findall(r"\]\(experiments/README\.md#([\w-]+)\)", (ROOT / "README.md").read_text()))
    assert linked, "no study links found"
    assert not sorted(linked - anchors), f"links to studies without an anchor: {sorted(linked - anchors)}"
