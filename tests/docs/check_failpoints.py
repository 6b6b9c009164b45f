#!/usr/bin/python3
"""Checks docs/development.md's failpoint table against the code, both ways.

A failpoint is named in the code by a string literal passed to
FailpointArmed, FailpointValue or a server's MaybeCrash
(core/failpoint.h); the table lists each as `name=VALUE`. Prints every
failpoint the code has and the table lacks, and every one the table lists
that the code has not; exits 1 if there is any.

    tests/docs/check_failpoints.py SOURCE_DIR
"""
import pathlib
import re
import sys

CALL = re.compile(r'\b(?:FailpointArmed|FailpointValue|MaybeCrash)\(\s*"([a-z_]+\.[a-z_]+)"')
ROW = re.compile(r'^\| `([a-z_]+\.[a-z_]+)=[^`]*` \|')
# Not code the binaries run: tests arm failpoints, builds hold copies.
SKIPPED = ("tests", "build", ".git")


def main():
    root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else ".")
    in_code = {}
    for path in sorted(root.rglob("*")):
        relative = path.relative_to(root)
        if path.suffix not in (".cc", ".h", ".cu") or relative.parts[0].startswith(SKIPPED):
            continue
        for name in CALL.findall(path.read_text(errors="replace")):
            in_code.setdefault(name, str(relative))
    doc = root / "docs" / "development.md"
    listed = set()
    for line in doc.read_text().splitlines():
        match = ROW.match(line)
        if match:
            listed.add(match.group(1))
    problems = []
    for name, path in sorted(in_code.items()):
        if name not in listed:
            problems.append(f"{path}: failpoint {name} is not in {doc.relative_to(root)}'s table")
    for name in sorted(listed - in_code.keys()):
        problems.append(f"{doc.relative_to(root)}: failpoint {name} is in the table, not in the code")
    if not in_code:
        problems.append("no failpoint found in the code: is the pattern stale?")
    for problem in problems:
        print(problem)
    print(f"{len(in_code)} failpoint(s) in the code, {len(listed)} in the table")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
