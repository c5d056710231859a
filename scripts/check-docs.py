#!/usr/bin/env python3
"""Check the repository's Markdown documentation.

Every relative link in README.md, docs/*.md, models/*.md, client/README.md, server/README.md,
deploy/README.md (and any other top-level folder's README.md) must resolve to an existing file or folder (relative to the file that holds the
link), and a `#fragment` into a Markdown file must name one of its headings (GitHub's anchor
rules). No documentation file may mention `../shared`. Links inside code blocks and inline code
are ignored; absolute URLs (http:, https:, mailto:) are not checked.

docs/architecture.md names code, and nothing there may go stale silently:
  - every name it cites in inline code that looks like code (`Class::Member`, a CamelCase name,
    a `folder/file.*` path), and every Class::Member in its drawings, must exist in the sources (server/, model/, client/, bench/, proto/,
    tests/, fuzz/, scripts/): a `A::B` needs a file where both names occur;
  - each ```path block draws one request's way through the code: a title ending in "(N hops)",
    then one line per step, "FILE  Name, Class::Member, ...": each file must exist and hold each
    name, and N must be the number of steps whose folder differs from the step before.

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


SOURCE_DIRS = ["server", "model", "client", "bench", "proto", "tests", "fuzz", "scripts"]
SOURCE_SUFFIXES = {".cc", ".h", ".inc", ".cu", ".cuh", ".proto", ".py", ".js", ".cmake", ".sh",
                   ".txt", ".html", ".css"}
CODE_SPAN = re.compile(r"`([^`]+)`")
QUALIFIED = re.compile(r"^(?:[A-Za-z_]\w*::)+~?[A-Za-z_]\w*(?:\(\))?$")
CAMEL = re.compile(r"^[A-Z][a-z0-9]+(?:[A-Z][a-z0-9]*)+(?:\(\))?$")
FILE_NAME = re.compile(r"^[\w.-]+(?:/[\w.*-]+)+$")


def sources(cache=[]):
    """{relative path: text} of the source files."""
    if not cache:
        files = {}
        for folder in SOURCE_DIRS:
            for path in sorted((ROOT / folder).rglob("*")):
                # Installed packages (tests/openai_sdk/node_modules) are not this project's code.
                if "node_modules" in path.parts:
                    continue
                if path.is_file() and path.suffix in SOURCE_SUFFIXES:
                    files[str(path.relative_to(ROOT))] = path.read_text(encoding="utf-8",
                                                                         errors="replace")
        cache.append(files)
    return cache[0]


def has_word(text, word):
    return re.search(r"(?<![\w])" + re.escape(word) + r"(?![\w])", text) is not None


def source_path_exists(name):
    """A path as the docs cite it: from the root, or under server/ or model/; * is any suffix."""
    for base in ["", "server/", "model/"]:
        if any(True for _ in ROOT.glob(base + name)):
            return True
    return False


def check_name(name):
    """None when `name` (a code span) exists in the sources, else why not."""
    name = name.strip()
    if name.endswith("()"):
        name = name[:-2]
    if "::" in name:
        parts = [p.lstrip("~") for p in name.split("::")]
        if parts[0] in ("std", "absl", "at", "grpc", "torch", "google", "c10", "nlohmann"):
            return None
        for text in sources().values():
            if all(has_word(text, p) for p in parts):
                return None
        return f"names {name}, which no source file holds"
    if not any(has_word(text, name) for text in sources().values()):
        return f"names {name}, which no source file holds"
    return None


def check_architecture(path, problems):
    """The names docs/architecture.md cites, and its drawn request paths."""
    rel = path.relative_to(ROOT)
    text = path.read_text(encoding="utf-8")
    for number, line in outside_fences(text):
        for match in CODE_SPAN.finditer(line):
            span = match.group(1)
            for token in re.split(r"[\s,]+|→|->", span):
                token = token.strip("().;:")
                if not token:
                    continue
                why = None
                if QUALIFIED.match(token) or QUALIFIED.match(token + "()"):
                    why = check_name(token)
                elif CAMEL.match(token) and " " not in span:
                    why = check_name(token)
                elif FILE_NAME.match(token) and not token.startswith(("http", "/")):
                    if "." in token.split("/")[-1] and not source_path_exists(token):
                        why = f"names {token}, which does not exist"
                if why:
                    problems.append(f"{rel}:{number}: {why}")
    # Qualified names inside the other code blocks (the drawings).
    fence = None
    for number, line in enumerate(text.split("\n"), 1):
        stripped = line.strip()
        if stripped.startswith("```"):
            fence = None if fence is not None else stripped[3:]
            continue
        if fence is None or fence == "path":
            continue
        for match in re.finditer(r"(?<![\w:])[A-Za-z_]\w*(?:::[A-Za-z_]\w*)+", line):
            why = check_name(match.group(0))
            if why:
                problems.append(f"{rel}:{number}: {why}")
    # The ```path blocks.
    lines = text.split("\n")
    i = 0
    while i < len(lines):
        if lines[i].strip() != "```path":
            i += 1
            continue
        start = i + 1
        title = lines[start]
        steps = []
        i = start + 1
        while i < len(lines) and lines[i].strip() != "```":
            if lines[i].strip():
                steps.append((i + 1, lines[i]))
            i += 1
        want = re.search(r"\((\d+) hops\)\s*$", title)
        if not want:
            problems.append(f"{rel}:{start + 1}: a path's title must end in \"(N hops)\"")
            continue
        hops, previous = 0, None
        for number, line in steps:
            file_name, _, names = line.strip().partition(" ")
            file_path = ROOT / file_name
            if not file_path.is_file():
                problems.append(f"{rel}:{number}: path step {file_name} does not exist")
                continue
            body = file_path.read_text(encoding="utf-8", errors="replace")
            # A class's members may be defined in its header or its source.
            sibling = file_path.with_suffix(".h" if file_path.suffix == ".cc" else ".cc")
            if sibling.is_file():
                body += sibling.read_text(encoding="utf-8", errors="replace")
            for name in re.split(r"[,\s]+", names.split("(")[0].strip()):
                if not name:
                    continue
                for part in name.split("::"):
                    if not has_word(body, part.lstrip("~")):
                        problems.append(f"{rel}:{number}: {file_name} does not hold {part}")
            folder = str(pathlib.Path(file_name).parent)
            if previous is not None and folder != previous:
                hops += 1
            previous = folder
        if hops != int(want.group(1)):
            problems.append(f"{rel}:{start + 1}: the path has {hops} hops between folders, "
                            f"its title says {want.group(1)}")


def main():
    problems = []
    check_architecture(ROOT / "docs" / "architecture.md", problems)
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
