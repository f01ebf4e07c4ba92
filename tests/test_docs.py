"""The README is a front door: short, no lab history a user cannot see (commit hashes, issue numbers), and every
relative link of the README and of docs/ leads somewhere (a file, and a heading or an `<a id>` for an anchor)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from conftest import ROOT

README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]

# [text](target) outside code; images too. Targets with a scheme (https:, mailto:) are not relative.
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")
FENCE = re.compile(r"^\s*(```|~~~)")
HEADING = re.compile(r"^\s{0,3}#{1,6}\s+(.*?)\s*#*\s*$")
ANCHOR_ID = re.compile(r"<a\s+(?:id|name)=\"([^\"]+)\"")
# a commit-hash-like token: 7-40 hex digits (with at least one digit and one letter a-f) in backticks, or after
# "commit"
HEX = r"(?=[0-9a-f]*[0-9])(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}"
COMMIT_HASH = re.compile(rf"`{HEX}[^`]*`|\bcommits?\s+(?:at\s+)?{HEX}\b", re.IGNORECASE)
ISSUE_NUMBER = re.compile(r"\b(?:issue|issues|PR|pull request)\s*#?\d+", re.IGNORECASE)


def prose_lines(path: Path) -> list[tuple[int, str]]:
    """(number, line) of the lines outside fenced code blocks."""
    lines, fenced = [], False
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            lines.append((number, line))
    return lines


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: markup dropped, lower case, punctuation removed, spaces to hyphens."""
    text = re.sub(r"<[^>]+>", "", heading)
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)  # a link keeps its text
    text = text.replace("`", "").replace("*", "").strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every anchor a page defines: its headings' slugs (GitHub numbers repeats -1, -2, ...) and `<a id>`s."""
    found: set[str] = set()
    seen: dict[str, int] = {}
    for _, line in prose_lines(path):
        heading = HEADING.match(line)
        if heading:
            base = slug(heading.group(1))
            count = seen.get(base, 0)
            seen[base] = count + 1
            found.add(base if count == 0 else f"{base}-{count}")
        found.update(ANCHOR_ID.findall(line))
    return found


def link_problems(path: Path) -> list[str]:
    problems = []
    for number, line in prose_lines(path):
        line = re.sub(r"`[^`]*`", "", line)  # inline code is not a link
        for target in LINK.findall(line):
            if SCHEME.match(target):
                continue
            file_part, _, fragment = target.partition("#")
            where = f"{path.relative_to(ROOT)}:{number}: {target}"
            linked = (path.parent / file_part).resolve() if file_part else path
            if not linked.exists():
                problems.append(f"{where}: no such file")
            elif not linked.is_relative_to(ROOT):
                problems.append(f"{where}: outside the repository")
            elif fragment and linked.suffix == ".md" and fragment not in anchors(linked):
                problems.append(f"{where}: no heading or <a id> '{fragment}' in {linked.relative_to(ROOT)}")
    return problems


def test_the_readme_is_under_200_lines():
    assert len(README.read_text(encoding="utf-8").splitlines()) < 200


def test_the_readme_names_no_commit_and_no_issue():
    text = README.read_text(encoding="utf-8")
    assert COMMIT_HASH.findall(text) == []
    assert ISSUE_NUMBER.findall(text) == []


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page):
    problems = link_problems(page)
    assert problems == [], "\n".join(problems)


def test_the_readme_links_every_docs_page():
    linked = {(README.parent / target.partition("#")[0]).resolve() for target in LINK.findall(README.read_text())}
    missing = [page.name for page in PAGES[1:] if page.resolve() not in linked]
    assert missing == []


def test_the_checks_catch_what_they_are_for(tmp_path, monkeypatch):
    """A broken file link, a broken anchor, a hash and an issue number are each found (the tests above can fail)."""
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "a.md").write_text("# A page\n\n## Some heading\n\n<a id=\"kept\"></a>\n", encoding="utf-8")
    page = tmp_path / "README.md"
    page.write_text(
        "[ok](docs/a.md) [ok](docs/a.md#some-heading) [ok](docs/a.md#kept) [ok](#top) [web](https://example.org)\n"
        "# Top\n[gone](docs/missing.md) [bad anchor](docs/a.md#nowhere)\n"
        "```\n[in code](docs/not-checked.md)\n```\n",
        encoding="utf-8",
    )
    monkeypatch.setitem(globals(), "ROOT", tmp_path)
    problems = link_problems(page)
    assert [p.split(": ", 1)[1] for p in problems] == [
        "docs/missing.md: no such file",
        "docs/a.md#nowhere: no heading or <a id> 'nowhere' in docs/a.md",
    ]
    assert COMMIT_HASH.findall("measured at commit 8cb7a59 and `593ac27`") == ["commit 8cb7a59", "`593ac27`"]
    assert COMMIT_HASH.findall("4,000 sentences, 2026-12-03, `decoder` and `1234567`") == []
    assert ISSUE_NUMBER.findall("the abort at exit (issue 39), see issue #15") == ["issue 39", "issue #15"]
