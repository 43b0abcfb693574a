"""Every axis of the variant vocabulary points at a documented sentence (issue 21 item 5, the audit).

Each axis names a doc anchor (``Axis.doc``); the anchor must be a heading of an existing page under docs/, and
every named value of a choice axis must be spelled on that page (the sentence a kernel author writes a kernel
from). A value the docs never name is a value no kernel can be written from.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from emulator.variants import AXES

DOCS = Path(__file__).resolve().parents[2] / "docs"


def _slug(heading: str) -> str:
    """GitHub's anchor of a markdown heading: lower case, punctuation other than - and _ dropped, spaces -> -."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(text: str) -> set:
    return {_slug(m.group(1)) for m in re.finditer(r"^#+\s+(.*)$", text, flags=re.M)}


@pytest.mark.parametrize("key", list(AXES))
def test_axis_doc_anchor_is_a_heading_of_an_existing_page(key):
    page, _, anchor = AXES[key].doc.partition("#")
    path = DOCS / page
    assert path.is_file(), (key, AXES[key].doc)
    if anchor:
        assert anchor in _anchors(path.read_text(encoding="utf-8")), (key, AXES[key].doc)


@pytest.mark.parametrize("key", [k for k, a in AXES.items() if a.kind == "choice"])
def test_every_value_is_spelled_on_the_axis_page(key):
    a = AXES[key]
    text = (DOCS / a.doc.partition("#")[0]).read_text(encoding="utf-8").lower()
    missing = [v for v in a.values if not re.search(r"(?<![\w])" + re.escape(str(v).lower()) + r"(?![\w])", text)]
    assert not missing, f"{key}: values not named on docs/{a.doc}: {missing}"
