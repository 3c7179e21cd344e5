#!/usr/bin/env python3
"""Fails when a Catch2 test name contains '[', ']' or ';'.

ctest registers each test case through Catch.cmake, which splits names at ';' and, on an
unmatched '[', silently merges every later test into one that runs nothing.
"""
import pathlib
import re
import sys

root = pathlib.Path(__file__).resolve().parent.parent
bad = []
for path in sorted((root / "tests").rglob("*.cpp")):
    text = path.read_text()
    for match in re.finditer(r'TEST_CASE\(\s*((?:"(?:[^"\\]|\\.)*"\s*)+)', text):
        name = "".join(re.findall(r'"((?:[^"\\]|\\.)*)"', match.group(1)))
        if any(c in name for c in "[];"):
            line = text.count("\n", 0, match.start()) + 1
            bad.append(f"{path.relative_to(root)}:{line}: test name {name!r} contains [, ] or ;")
for message in bad:
    print(message, file=sys.stderr)
sys.exit(1 if bad else 0)
