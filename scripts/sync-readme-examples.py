#!/usr/bin/env python3
"""Copies each examples/<file> into the README code block after its `<!-- example: <file> -->`
marker (tests/readme_in_sync.cmake checks they are identical)."""
import pathlib
import re
import sys

root = pathlib.Path(__file__).resolve().parent.parent
readme = root / "README.md"
text = readme.read_text()
pattern = re.compile(r"(<!-- example: (?P<name>[\w.]+) -->\n```cpp\n)(?P<body>.*?)(```)", re.S)


def replace(match):
    source = (root / "examples" / match.group("name")).read_text()
    return match.group(1) + source + match.group(4)


new = pattern.sub(replace, text)
if new != text:
    readme.write_text(new)
    print("README.md: examples updated")
sys.exit(0)
