#!/usr/bin/python3
"""Every relative link in README.md and docs/*.md resolves.

    check_links.py ROOT

A link [text](path), [text](path#anchor) or [text](#anchor) must name a file
or folder that exists, relative to the page, and an anchor must be a heading
of the page it names (GitHub's slugs). Links in code (fenced blocks, `spans`)
and to other sites are not checked. Prints each broken link as FILE:LINE and
exits 1 when there is one.
"""

import os
import re
import sys

LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(([^()\s]+)(?:\s+\"[^\"]*\")?\)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")


def strip_code(line):
    return re.sub(r"`[^`]*`", "", line)


def slug(heading):
    """GitHub's anchor for a heading."""
    text = re.sub(r"`|\*|_(?=\w)|(?<=\w)_", "", heading)
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    text = text.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path, cache={}):
    if path not in cache:
        found = set()
        counts = {}
        fenced = False
        with open(path, encoding="utf-8") as f:
            for line in f:
                if line.lstrip().startswith("```"):
                    fenced = not fenced
                    continue
                match = None if fenced else HEADING.match(line)
                if match:
                    base = slug(match.group(2))
                    n = counts.get(base, 0)
                    counts[base] = n + 1
                    found.add(base if n == 0 else f"{base}-{n}")
        cache[path] = found
    return cache[path]


def check(page, root):
    broken = []
    fenced = False
    with open(page, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if line.lstrip().startswith("```"):
                fenced = not fenced
                continue
            if fenced:
                continue
            for match in LINK.finditer(strip_code(line)):
                target = match.group(1)
                if re.match(r"^[a-z][a-z0-9+.-]*:", target):
                    continue  # another site, mailto:
                path, _, anchor = target.partition("#")
                where = os.path.normpath(os.path.join(os.path.dirname(page), path)) if path else page
                name = os.path.relpath(page, root)
                if not os.path.exists(where):
                    broken.append(f"{name}:{number}: {target}: no such file")
                elif anchor and where.endswith(".md") and anchor not in anchors(where):
                    broken.append(f"{name}:{number}: {target}: no heading #{anchor} in "
                                  f"{os.path.relpath(where, root)}")
    return broken


def main():
    root = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else ".")
    pages = [os.path.join(root, "README.md")]
    docs = os.path.join(root, "docs")
    for dirpath, _, files in os.walk(docs):
        pages += [os.path.join(dirpath, f) for f in sorted(files) if f.endswith(".md")]
    broken = []
    for page in pages:
        broken += check(page, root)
    for line in broken:
        print(line)
    print(f"{len(pages)} pages, {len(broken)} broken link(s)")
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())
