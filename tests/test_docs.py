"""The documentation links only inside the repository, and every link resolves.

README.md, CHANGELOG.md and docs/*.md are what a user reads, on GitHub or in a clone. Every
link of theirs must be relative and name a file or directory of the repository; an
``#anchor`` must name a heading of the page it points to, as GitHub makes heading anchors;
and no page may name the developers' contract (``SPEC.md``, ``../shared``), which users never
have. Links in code blocks and code spans are text, not links.
"""

from __future__ import annotations

import re
import unicodedata
from pathlib import Path
from urllib.parse import unquote

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = sorted([ROOT / "README.md", ROOT / "CHANGELOG.md", *(ROOT / "docs").glob("*.md")])

_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")
_CODE_SPAN = re.compile(r"(`+)(?:(?!\1).)+?\1", re.S)
_INLINE_LINK = re.compile(
    r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]"  # the text, one level of brackets inside
    r"\(\s*<?([^()\s<>]*)>?(?:\s+\"[^\"]*\")?\s*\)"  # (target "title")
)
_REFERENCE = re.compile(r"^ {0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s.*)?$", re.M)
_AUTOLINK = re.compile(r"<([A-Za-z][A-Za-z0-9+.-]*:[^\s<>]*)>")
_BARE_URL = re.compile(r"(?<![\w/(<])(?:https?://|www\.)[^\s<>)]+")
_HREF = re.compile(r"""<a\s[^>]*\bhref\s*=\s*["']([^"']*)["']""", re.I)
_HTML_ANCHOR = re.compile(r"""<a\s[^>]*\b(?:id|name)\s*=\s*["']([^"']+)["']""", re.I)
_ATX = re.compile(r"^ {0,3}(#{1,6})(?:[ \t]+(.*?))?(?:[ \t]+#+)?[ \t]*$")
_SETEXT = re.compile(r"^ {0,3}(=+|-+)[ \t]*$")
_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")
#: What users never have: the developers' contract and the directory it lives in.
_FORBIDDEN = re.compile(r"\bSPEC\b|SPEC\.md|\.\./shared", re.I)


def prose_lines(text: str) -> list[str]:
    """The lines of a Markdown page with fenced code blocks blanked (line numbers kept)."""
    out = []
    fence: str | None = None
    for line in text.splitlines():
        m = _FENCE.match(line)
        if fence is None and m:
            fence = m.group(1)
            out.append("")
        elif fence is not None:
            if line.strip().startswith(fence[0] * len(fence)) and not line.strip().strip(fence[0]):
                fence = None
            out.append("")
        else:
            out.append(line)
    return out


def _plain(markdown: str) -> str:
    """The text a heading renders as: code spans unwrapped, links reduced to their text,
    images, HTML tags and emphasis markers dropped."""
    text = _CODE_SPAN.sub(lambda m: m.group(0)[len(m.group(1)) : -len(m.group(1))], markdown)
    text = re.sub(r"!\[[^\]]*\]\([^)]*\)", "", text)
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    text = re.sub(r"<[^>]+>", "", text)
    return re.sub(r"\*+|~~|(?<!\w)_+|_+(?!\w)", "", text)


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: its text lower-cased, without punctuation but ``-`` and
    ``_``, spaces turned into ``-``."""
    text = _plain(heading).strip().lower()
    kept = "".join(
        c
        for c in text
        if c in "-_ " or unicodedata.category(c)[0] in "LMN" or unicodedata.category(c) == "Pc"
    )
    return kept.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """Every anchor a link may name in ``page``: its headings' slugs (a repeated one gets
    ``-1``, ``-2``, ... as on GitHub) and explicit ``<a id=...>`` / ``<a name=...>``."""
    lines = prose_lines(page.read_text(encoding="utf-8"))
    found: set[str] = set()
    seen: dict[str, int] = {}
    for i, line in enumerate(lines):
        found.update(_HTML_ANCHOR.findall(line))
        m = _ATX.match(line)
        text = (m.group(2) or "") if m else None
        if text is None and i > 0 and lines[i - 1].strip() and _SETEXT.match(line):
            previous = lines[i - 1]
            if not _ATX.match(previous) and not previous.lstrip().startswith(("-", "*", "|", ">")):
                text = previous.strip()
        if text is None:
            continue
        base = slug(text)
        n = seen.get(base, 0)
        seen[base] = n + 1
        found.add(base if n == 0 else f"{base}-{n}")
    return found


def links(page: Path) -> list[tuple[int, str]]:
    """(line number, target) of every link in the prose of ``page``: inline links and images,
    reference definitions, autolinks, bare URLs GitHub would link, and HTML ``href``."""
    out = []
    for number, line in enumerate(prose_lines(page.read_text(encoding="utf-8")), start=1):
        ref = _REFERENCE.match(line)
        if ref:
            out.append((number, ref.group(1)))
            continue
        prose = _CODE_SPAN.sub("", line)
        for pattern in (_INLINE_LINK, _AUTOLINK, _HREF):
            out.extend((number, target) for target in pattern.findall(prose))
        without_links = _AUTOLINK.sub("", _INLINE_LINK.sub("", prose))
        out.extend((number, url) for url in _BARE_URL.findall(without_links))
    return out


def link_problems(page: Path, root: Path) -> list[str]:
    """What is wrong with each link of ``page``, one line each; empty when all resolve."""
    problems = []
    for number, target in links(page):
        where = f"{page.relative_to(root)}:{number}: {target}"
        if not target:
            problems.append(f"{where}: empty link")
            continue
        if _SCHEME.match(target) or target.startswith(("//", "www.")):
            problems.append(f"{where}: leaves the repository (use a relative link)")
            continue
        path_part, _, fragment = target.partition("#")
        path = unquote(path_part)
        if path.startswith("/"):
            problems.append(f"{where}: absolute path (use a path relative to the page)")
            continue
        resolved = (page.parent / path).resolve() if path else page
        if not resolved.is_relative_to(root):
            problems.append(f"{where}: leaves the repository")
            continue
        if not resolved.exists():
            problems.append(f"{where}: {resolved.relative_to(root)} does not exist")
            continue
        if not fragment:
            continue
        if resolved.suffix.lower() != ".md" or not resolved.is_file():
            problems.append(f"{where}: an anchor needs a Markdown page to check it against")
        elif unquote(fragment) not in anchors(resolved):
            problems.append(
                f"{where}: no heading of {resolved.relative_to(root)} has the anchor "
                f"#{unquote(fragment)}"
            )
    return problems


#: In code the word is matched as written: ``spec`` is a common word there (a partition spec).
_FORBIDDEN_IN_CODE = re.compile(r"\bSPEC\b|SPEC\.md|\.\./shared")


def forbidden_mentions(page: Path, root: Path, pattern: re.Pattern[str] = _FORBIDDEN) -> list[str]:
    """Every line of ``page`` (code included) naming the developers' contract."""
    return [
        f"{page.relative_to(root)}:{number}: {line.strip()}"
        for number, line in enumerate(page.read_text(encoding="utf-8").splitlines(), start=1)
        if pattern.search(line)
    ]


def _id(page: Path) -> str:
    return str(page.relative_to(ROOT))


@pytest.mark.parametrize("page", PAGES, ids=_id)
def test_every_link_stays_in_the_repository_and_resolves(page: Path) -> None:
    assert link_problems(page, ROOT) == []


@pytest.mark.parametrize("page", PAGES, ids=_id)
def test_no_page_names_the_developers_contract(page: Path) -> None:
    assert forbidden_mentions(page, ROOT) == []


PACKAGES = ("commitsteps", "store", "publisher", "jobs")
#: Code and build files, which users read too: none names the developers' contract either.
SOURCES = sorted(
    p
    for p in [
        *ROOT.glob("*.toml"),
        *ROOT.glob("*.cfg"),
        ROOT / "Makefile",
        *(
            f
            for d in (
                "commitsteps",
                "store",
                "publisher",
                "jobs",
                "tests",
                "benchmarks",
                "examples",
            )
            for f in (ROOT / d).rglob("*.py")
        ),
    ]
    if p != Path(__file__).resolve()
)


def test_no_source_file_names_the_developers_contract() -> None:
    assert len(SOURCES) > 50
    found = [m for src in SOURCES for m in forbidden_mentions(src, ROOT, _FORBIDDEN_IN_CODE)]
    assert found == []


def test_the_index_lists_every_page_of_docs() -> None:
    index = ROOT / "docs" / "README.md"
    linked = {(index.parent / t.partition("#")[0]).resolve() for _, t in links(index)}
    pages = {p.resolve() for p in (ROOT / "docs").glob("*.md") if p.name != "README.md"}
    assert sorted(p.name for p in pages - linked) == []


def test_the_pages_are_all_there() -> None:
    # The README's first two commands are the way in: make demo, make test.
    first, second = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()[:2]
    assert (first.split("#")[0].strip(), second.split("#")[0].strip()) == (
        "make demo",
        "make test",
    )
    names = {p.name for p in (ROOT / "docs").glob("*.md")}
    assert names >= {
        "README.md",
        "guarantees.md",
        "protocol.md",
        "storage-format.md",
        "operations.md",
        "api.md",
        "configuration.md",
    }


# -- the checker itself ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("heading", "expected"),
    [
        ("1. Exactly once", "1-exactly-once"),
        ("Your own PySpark job: `jobs.Batch`", "your-own-pyspark-job-jobsbatch"),
        ("[job]", "job"),
        ("What is refused, and why", "what-is-refused-and-why"),
        ("Exit 2: refused before anything ran", "exit-2-refused-before-anything-ran"),
        ("**Bold** and _em_ and snake_case", "bold-and-em-and-snake_case"),
        ("A [link](x.md) here", "a-link-here"),
        ("Ünïcødé — dash", "ünïcødé--dash"),
    ],
)
def test_slugs_are_githubs(heading: str, expected: str) -> None:
    assert slug(heading) == expected


def test_the_checker_finds_every_kind_of_bad_link(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "other.md").write_text(
        "# Other\n\n## Same\n\n## Same\n\n```\n## Not a heading\n```\n"
    )
    page = tmp_path / "docs" / "page.md"
    page.write_text(
        "# Page\n\n"
        "[ok](other.md) [ok](other.md#same-1) [ok](#page) [ok](../docs/)\n"
        "[missing](nope.md)\n"
        "[bad anchor](other.md#not-a-heading)\n"
        "[outside](../../elsewhere.md)\n"
        "[external](https://example.com/) and https://example.org/ bare\n"
        "`[in code](nope.md)`\n"
        "```\n[in a block](nope.md)\n```\n"
        "See SPEC.md, ../shared/x and SPEC's list, but not FSSPEC_S3_KEY.\n"
    )
    problems = link_problems(page, tmp_path)
    assert [p.split(": ", 2)[1] for p in problems] == [
        "nope.md",
        "other.md#not-a-heading",
        "../../elsewhere.md",
        "https://example.com/",
        "https://example.org/",
    ]
    assert [m.split(":")[1] for m in forbidden_mentions(page, tmp_path)] == ["12"]
