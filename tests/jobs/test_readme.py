"""README.md's Python example runs exactly as written (on the real default target, with its shipped EAGLE drafter),
and the README names what every entry point writes where."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[2] / "README.md"


def python_example() -> str:
    """The ```python block under "From Python"."""
    text = README.read_text()
    match = re.search(r"From Python.*?\n```python\n(.*?)\n```", text, flags=re.S)
    assert match, "README.md has no ```python block under 'From Python'"
    return match.group(1)


@pytest.mark.real_model
def test_the_readmes_python_example_runs_as_written():
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(python_example(), str(README), "exec"), {"__name__": "readme"})
    printed = out.getvalue().strip().splitlines()
    assert printed and printed[-1].startswith("eagle, k=") and "3 prompts: τ " in printed[-1]
    assert "speedup vs plain decoding" in printed[-1] and "measured wall clock" in printed[-1]
    assert printed[-1].endswith("same output as plain decoding: True")  # greedy: identical outputs


def test_the_readme_says_where_each_entry_point_writes():
    table = README.read_text().split("## Where things are written")[1].split("\n## ")[0]
    for entry in ("run", "run -m", "report", "verify_dist", "train", "export"):
        assert f"`python -m specdec.{entry}" in table
