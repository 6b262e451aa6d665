"""The README's "Python" section runs as written: its ```python blocks, in order, as one doctest.

Each block is a ``>>>`` transcript with the real output; the blocks share one namespace, as a
notebook's cells do. They run in a fresh folder (anything they write lands there) beside a link to
the checkout's ``hwmodels``, because they name the committed calibration and RunRecord by their
path in the checkout, as the README's commands do.
"""

from __future__ import annotations

import doctest
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SECTION = "## Python: the same in a notebook"


def python_section() -> str:
    """The section's ```python blocks, joined, from its heading to the next ``## `` heading."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert text.count(SECTION) == 1, f"README.md needs one '{SECTION}' section"
    body = text.split(SECTION, 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"^```python\n(.*?)^```$", body, flags=re.S | re.M)
    assert blocks, "the Python section has no ```python blocks"
    return "\n".join(blocks)


def test_readme_python_examples_run_as_shown(tmp_path, monkeypatch):
    pytest.importorskip("pandas")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "hwmodels").symlink_to(ROOT / "hwmodels", target_is_directory=True)
    test = doctest.DocTestParser().get_doctest(python_section(), {}, "README.md: Python", "README.md", 0)
    assert len(test.examples) >= 20
    runner = doctest.DocTestRunner(optionflags=doctest.NORMALIZE_WHITESPACE | doctest.ELLIPSIS)
    report: list[str] = []
    runner.run(test, out=report.append)
    assert runner.failures == 0, "".join(report)
