"""Every relative link in README.md and docs/*.md points at a file that exists and, where
it names an anchor, at a heading of that page (GitHub's anchor for it)."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```.*?^```", re.S | re.M)
CODE = re.compile(r"`[^`\n]*`")
LINK = re.compile(r"\]\(([^)\s]+)\)")


def prose(text: str) -> str:
    """The text a reader sees as markdown: code blocks and code spans left out."""
    return CODE.sub("", FENCE.sub("", text))


def anchors(page: Path) -> set:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to hyphens,
    a repeated one numbered -1, -2, ..."""
    seen, out = {}, set()
    for line in FENCE.sub("", page.read_text()).splitlines():
        heading = re.match(r"#{1,6} (.+)", line)
        if not heading:
            continue
        slug = re.sub(r"[^\w\- ]", "", heading.group(1).replace("`", "").lower())
        slug = slug.replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        out.add(slug if count == 0 else f"{slug}-{count}")
    return out


def broken_links(page: Path) -> list:
    broken = []
    for target in LINK.findall(prose(page.read_text())):
        if re.match(r"[a-z]+:", target):  # https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        linked = (page.parent / path).resolve() if path else page
        if not linked.exists():
            broken.append(f"{page.name}: {target} (no such file)")
        elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
            broken.append(f"{page.name}: {target} (no such heading)")
    return broken


def test_every_relative_link_resolves():
    broken = [problem for page in PAGES for problem in broken_links(page)]
    assert not broken, "\n".join(broken)


def test_the_check_sees_a_broken_file_and_a_broken_anchor(tmp_path):
    (tmp_path / "other.md").write_text("# Other page\n\n## A `code` heading (here)\n")
    page = tmp_path / "page.md"
    page.write_text("[ok](other.md#a-code-heading-here) [top](#title) [gone](missing.md)\n"
                    "[bad](other.md#nowhere) `[not a link](missing2.md)`\n\n# Title\n")
    assert broken_links(page) == ["page.md: missing.md (no such file)",
                                  "page.md: other.md#nowhere (no such heading)"]
