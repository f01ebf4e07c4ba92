"""docs/reliability.md's tables of the run's record and of what a resume may change are the code's own
(simcse_hn.record_compare): a field or an allowlist entry added to the code and not to the page fails here."""

from __future__ import annotations

import re

import pytest
from conftest import ROOT

from simcse_hn.record_compare import allowlist_markdown, record_markdown

PAGE = ROOT / "docs" / "reliability.md"


@pytest.mark.parametrize("block, made", [("allowlist", allowlist_markdown), ("record", record_markdown)])
def test_the_pages_tables_are_the_codes(block, made):
    page = PAGE.read_text(encoding="utf-8")
    found = re.search(rf"<!-- {block}: generated from [^>]*-->\n(.*?)\n<!-- /{block} -->", page, flags=re.S)
    assert found is not None, f"no {block} table in docs/reliability.md"
    assert found.group(1) == made(), f"docs/reliability.md's {block} table differs from {made.__qualname__}()"
