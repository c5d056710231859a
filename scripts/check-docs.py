#!/usr/bin/env python3
"""Check the repository's Markdown documentation.

Every relative link in README.md, docs/*.md, models/*.md, client/README.md, server/README.md,
deploy/README.md (and any other top-level folder's README.md) must resolve to an existing file or folder (relative to the file that holds the
link), and a `#fragment` into a Markdown file must name one of its headings (GitHub's anchor
rules). No documentation file may mention `../shared`. Links inside code blocks and inline code
are ignored; absolute URLs (http:, https:, mailto:) are not checked.

    scripts/check-docs.py          # prints each problem as FILE:LINE: message; exit 1 if any
"""
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
DOCS = ["README.md", "docs/*.md", "models/*.md", "client/README.md", "server/README.md",
        "deploy/README.md", "*/README.md"]

LINK = re.compile(r"!?\[(?:[^\]\\]|\\.)*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
INLINE_CODE = re.compile(r"`+[^`]*`+")


def doc_files():
    seen = set()
    for pattern in DOCS:
        for path in sorted(ROOT.glob(pattern)):
            if path.is_file() and path not in seen:
                seen.add(path)
                yield path


def outside_fences(text):
    """(line number, line) for the lines outside fenced code blocks."""
    fence = None
    for number, line in enumerate(text.split("\n"), 1):
        stripped = line.lstrip()
        if fence is None and stripped.startswith(("```", "~~~")):
            fence = stripped[:3]
            continue
        if fence is not None:
            if stripped.startswith(fence):
                fence = None
            continue
        yield number, line


def anchors(path, cache={}):
    """GitHub's heading anchors of a Markdown file: lower case, punctuation dropped (inline code
    keeps its text, backticks go), spaces become hyphens, repeats get -1, -2, ..."""
    if path not in cache:
        result, counts = set(), {}
        for _, line in outside_fences(path.read_text(encoding="utf-8")):
            match = re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
            if not match:
                continue
            slug = re.sub(r"[^\w\- ]", "", match.group(1).strip().lower()).replace(" ", "-")
            n = counts.get(slug, 0)
            counts[slug] = n + 1
            result.add(slug if n == 0 else f"{slug}-{n}")
        cache[path] = result
    return cache[path]


def main():
    problems = []
    for path in doc_files():
        rel = path.relative_to(ROOT)
        text = path.read_text(encoding="utf-8")
        for number, line in enumerate(text.split("\n"), 1):
            if "../shared" in line:
                problems.append(f"{rel}:{number}: mentions ../shared")
        for number, line in outside_fences(text):
            for match in LINK.finditer(INLINE_CODE.sub("", line)):
                target = match.group(1)
                if re.match(r"[a-z][a-z0-9+.-]*:", target, re.I):
                    continue  # http:, https:, mailto: ...
                file_part, _, fragment = target.partition("#")
                dest = (path.parent / file_part).resolve() if file_part else path
                if not dest.exists():
                    problems.append(f"{rel}:{number}: broken link {target}")
                    continue
                if fragment and dest.is_file() and dest.suffix == ".md":
                    if fragment.lower() not in anchors(dest):
                        problems.append(f"{rel}:{number}: no heading #{fragment} in "
                                        f"{dest.relative_to(ROOT)}")
    # proto/README.md names every RPC of the protos it describes.
    readme = (ROOT / "proto" / "README.md").read_text(encoding="utf-8")
    for proto in sorted((ROOT / "proto").rglob("*.proto")):
        for match in re.finditer(r"^\s*rpc\s+(\w+)\s*\(", proto.read_text(encoding="utf-8"),
                                 re.M):
            if f"`{match.group(1)}`" not in readme:
                problems.append(f"proto/README.md: does not name rpc {match.group(1)} of "
                                f"{proto.relative_to(ROOT)}")
    checked = sum(1 for _ in doc_files())
    for problem in problems:
        print(problem)
    print(f"check-docs: {checked} files, {len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
