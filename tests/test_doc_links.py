"""Every relative link in README.md and docs/*.md resolves.

A link's file must exist, relative to the page that holds it, and a ``#fragment`` into a
Markdown page must name one of that page's headings (GitHub's anchors: lower case,
punctuation dropped, spaces as hyphens, ``-1``, ``-2`` ... for repeated headings). Links
and images inside code (fenced blocks, inline code spans) are text, not links, and are not
read; links with a scheme (``https:``, ``mailto:``) are outside the checkout and not
fetched.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
_FENCE = re.compile(r"^\s*(```|~~~)")
_LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_SRC = re.compile(r"<(?:img|a)\b[^>]*?\b(?:src|href)=\"([^\"]+)\"", re.I)


def prose(text: str) -> str:
    """The page without its fenced code blocks and inline code spans."""
    kept, fenced = [], False
    for line in text.splitlines():
        if _FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            kept.append(re.sub(r"(`+).*?\1", "", line))
    return "\n".join(kept)


def links(text: str) -> list[str]:
    """Every link target of a page's prose: Markdown links and images, HTML src/href."""
    body = prose(text)
    return [m.group(1) for m in _LINK.finditer(body)] + [m.group(1) for m in
                                                          _SRC.finditer(body)]


def anchors(text: str) -> set[str]:
    """The anchors GitHub gives a page's headings."""
    seen: dict[str, int] = {}
    out = set()
    for line in prose(text).splitlines():
        heading = re.match(r"^#{1,6}\s+(.+?)\s*#*\s*$", line)
        if not heading:
            continue
        slug = re.sub(r"[^\w\- ]", "", heading.group(1).strip().lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def broken(page: Path, text: str) -> list[str]:
    """The relative links of ``text`` (held by ``page``) that do not resolve, with why."""
    bad = []
    for target in links(text):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):  # https:, mailto:, ...
            continue
        path, _, fragment = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            bad.append(f"{target}: no file {file}")
        elif fragment and file.suffix == ".md" and fragment not in anchors(file.read_text()):
            bad.append(f"{target}: no heading #{fragment} in {file.name}")
    return bad


def test_the_check_finds_a_broken_link(tmp_path):
    """The check is not vacuous: a missing file, a missing heading and a link hidden in
    code are each told apart from a good link."""
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "A.md").write_text("# Top\n\n## A node's own ledger\n\n## Top\n")
    page = tmp_path / "README.md"
    text = ("[ok](docs/A.md#a-nodes-own-ledger) [ok](docs/A.md#top-1) [web](https://x.org/y)\n"
            "[gone](docs/B.md) [no heading](docs/A.md#nowhere) <img src=\"docs/p.png\">\n"
            "`model[c](x)` and\n```python\nf[0](x)  # [code](docs/C.md)\n```\n")
    got = broken(page, text)
    assert len(got) == 3, got
    assert got[0].startswith("docs/B.md") and got[1].startswith("docs/A.md#nowhere")
    assert got[2].startswith("docs/p.png")


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_relative_link_resolves(page):
    text = page.read_text()
    assert broken(page, text) == [], f"{page.name} has links that do not resolve"


def test_the_readme_links_every_docs_page():
    """The README is the index: one link reaches each docs page (a page no link reaches
    is a page no reader finds)."""
    readme = ROOT / "README.md"
    linked = {(readme.parent / t.partition("#")[0]).resolve() for t in links(readme.read_text())}
    unlinked = [p.name for p in PAGES[1:] if p.resolve() not in linked]
    assert unlinked == [], f"README.md links no page for: {unlinked}"


def test_the_readme_stays_an_index():
    """Issue 34: at most 200 lines, with the run command and the test command that .ci/run
    extracts by their markers; the reference text lives on the docs pages."""
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 200
    assert "Set up and run the default job" in text and "<!-- test-command" in text
