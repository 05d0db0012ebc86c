#!/usr/bin/env python3
"""Keeps the documentation honest: README.md and docs/*.md.

    scripts/docs.py          check (the test `docs_in_sync` runs this; exit 1 on a problem)
    scripts/docs.py --fix    copy every marked source into the code block after its marker

Code blocks:
- Every fenced block names its language.
- A C++ (cpp) or CMake (cmake) block follows a marker saying where its text lives, so the
  test suite compiles it:
    <!-- example: examples/readme_tracer.cpp -->   the block is the whole file
    <!-- snippet: examples/snippets.cpp#traces -->  the block is the region of the file between
        a line holding `docs-snippet: traces` and the next line holding `docs-snippet-end`
        (marker lines excluded, common indentation removed)
  and the block's text must equal that source exactly.
- A Python block either follows such a marker or is a whole program that
  python/tests/test_docs.py runs (each block on its own, in a fresh namespace).
- Shell commands (sh) and program output (text) are shown as they are.

Links: every relative link points at a file that exists, and an anchor (#section) at a
heading of that file; every page under docs/ is linked from docs/README.md. README.md stays
under 300 lines: it is the front door, the manual is docs/.
"""
from __future__ import annotations

import pathlib
import re
import sys
from dataclasses import dataclass

ROOT = pathlib.Path(__file__).resolve().parent.parent
README_LIMIT = 300
MARKED_LANGUAGES = {"cpp", "cmake"}
FREE_LANGUAGES = {"sh", "text", "python"}
MARKER = re.compile(r"^<!-- (example|snippet): (\S+) -->$")
FENCE = re.compile(r"^```(\S*)\s*$")
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


@dataclass
class Block:
    page: pathlib.Path
    line: int  # the opening fence, 1-based
    language: str
    text: str
    marker: tuple[str, str] | None  # ("example" | "snippet", target)
    span: tuple[int, int]  # character offsets of the text inside the page


def pages() -> list[pathlib.Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def code_blocks(page: pathlib.Path) -> list[Block]:
    """The fenced code blocks of a page, with the marker before each, if any."""
    source = page.read_text()
    lines = source.splitlines(keepends=True)
    blocks, offset, i, previous = [], 0, 0, ""
    offsets = []
    for line in lines:
        offsets.append(offset)
        offset += len(line)
    offsets.append(offset)
    while i < len(lines):
        match = FENCE.match(lines[i].rstrip("\n"))
        if not match:
            if lines[i].strip():
                previous = lines[i].strip()
            i += 1
            continue
        start = i
        i += 1
        while i < len(lines) and lines[i].rstrip("\n") != "```":
            i += 1
        if i == len(lines):
            raise SystemExit(f"{page.relative_to(ROOT)}:{start + 1}: a code block is never closed")
        marker = MARKER.match(previous)
        blocks.append(Block(page, start + 1, match.group(1), "".join(lines[start + 1:i]),
                            (marker.group(1), marker.group(2)) if marker else None,
                            (offsets[start + 1], offsets[i])))
        previous = ""
        i += 1
    return blocks


def snippet(path: pathlib.Path, name: str) -> str:
    """The region of `path` between `docs-snippet: name` and `docs-snippet-end`, dedented."""
    lines = path.read_text().splitlines(keepends=True)
    begin = [n for n, line in enumerate(lines) if re.search(rf"docs-snippet: {re.escape(name)}\s*$", line)]
    if len(begin) != 1:
        raise ValueError(f"{path.relative_to(ROOT)} has {len(begin)} regions named '{name}' (needs 1)")
    end = next((n for n in range(begin[0] + 1, len(lines)) if "docs-snippet-end" in lines[n]), None)
    if end is None:
        raise ValueError(f"{path.relative_to(ROOT)}: region '{name}' has no docs-snippet-end")
    region = lines[begin[0] + 1:end]
    indents = [len(line) - len(line.lstrip(" ")) for line in region if line.strip()]
    cut = min(indents, default=0)
    return "".join(line[cut:] if line.strip() else "\n" for line in region)


def source_of(block: Block) -> str:
    kind, target = block.marker
    if kind == "example":
        path = ROOT / target
        if not path.is_file():
            raise ValueError(f"no file {target}")
        return path.read_text()
    file, _, name = target.partition("#")
    if not name or not (ROOT / file).is_file():
        raise ValueError(f"a snippet marker needs FILE#NAME of an existing file, got '{target}'")
    return snippet(ROOT / file, name)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading."""
    text = re.sub(r"[`*]|<[^>]+>", "", heading.strip().lower())
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(page: pathlib.Path) -> set[str]:
    found, seen, fenced = set(), {}, False
    for line in page.read_text().splitlines():
        if line.startswith("```"):
            fenced = not fenced
        if fenced or not line.startswith("#"):
            continue
        base = slug(line.lstrip("#"))
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def check_links(page: pathlib.Path, problems: list[str]) -> set[pathlib.Path]:
    linked = set()
    fenced = False
    for number, line in enumerate(page.read_text().splitlines(), 1):
        if line.startswith("```"):
            fenced = not fenced
        if fenced:
            continue
        for target in LINK.findall(line):
            if re.match(r"^[a-z]+:", target):
                continue  # https:, mailto:
            file, _, anchor = target.partition("#")
            path = (page.parent / file).resolve() if file else page
            where = f"{page.relative_to(ROOT)}:{number}"
            if not path.exists():
                problems.append(f"{where}: the link '{target}' points at nothing")
                continue
            linked.add(path)
            if anchor and path.suffix == ".md" and anchor not in anchors(path):
                problems.append(f"{where}: '{target}': {path.name} has no heading #{anchor}")
    return linked


def check() -> list[str]:
    problems = []
    for page in pages():
        name = page.relative_to(ROOT)
        for block in code_blocks(page):
            where = f"{name}:{block.line}"
            if not block.language:
                problems.append(f"{where}: a code block without a language")
            elif block.language not in MARKED_LANGUAGES | FREE_LANGUAGES:
                problems.append(f"{where}: unknown code block language '{block.language}'")
            elif block.language in MARKED_LANGUAGES and block.marker is None:
                problems.append(f"{where}: a {block.language} block without an example or "
                                "snippet marker (its text must live in a compiled file)")
            if block.marker is None:
                continue
            try:
                expected = source_of(block)
            except ValueError as error:
                problems.append(f"{where}: {error}")
                continue
            if block.text != expected:
                problems.append(f"{where}: the block differs from {block.marker[1]} "
                                "(scripts/docs.py --fix copies it)")
        linked = check_links(page, problems)
        if page == ROOT / "docs" / "README.md":
            for other in sorted((ROOT / "docs").glob("*.md")):
                if other != page and other not in linked:
                    problems.append(f"docs/README.md does not link {other.relative_to(ROOT)}")
    lines = len((ROOT / "README.md").read_text().splitlines())
    if lines > README_LIMIT:
        problems.append(f"README.md has {lines} lines; keep it under {README_LIMIT} (move the "
                        "detail to docs/)")
    return problems


def fix() -> None:
    for page in pages():
        text = page.read_text()
        for block in reversed(code_blocks(page)):
            if block.marker is None:
                continue
            try:
                source = source_of(block)
            except ValueError:
                continue  # check() reports it
            start, end = block.span
            text = text[:start] + source + text[end:]
        if text != page.read_text():
            page.write_text(text)
            print(f"{page.relative_to(ROOT)}: code blocks updated")


def main() -> int:
    if sys.argv[1:] == ["--fix"]:
        fix()
    problems = check()
    for problem in problems:
        print(problem)
    if not problems:
        print(f"docs: {len(pages())} pages in sync")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
