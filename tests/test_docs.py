"""The repository's prose holds together (issue #41: a broken code fence, and timings and counts
that disagreed between the README, the guide and what runs)."""
from __future__ import annotations

import pytest

from conftest import REPO

DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


@pytest.mark.unit
@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_every_code_fence_closes_on_a_line_of_its_own(doc):
    """A fence closed with text after it (``` `--gpu` takes ...) swallows the prose that follows
    into the code block, up to the next fence."""
    inside, opened = False, None
    for number, line in enumerate(doc.read_text().splitlines(), 1):
        if not line.startswith("```"):
            continue
        if inside:
            assert line.strip() == "```", f"{doc.name}:{number}: a fence closes with text after it: {line!r}"
        else:
            opened = number
        inside = not inside
    assert not inside, f"{doc.name}:{opened}: a code fence never closes"
