"""The Python code blocks of README.md and docs/*.md, each run as a program of its own.

A block that follows an `<!-- example: ... -->` or `<!-- snippet: ... -->` marker is a copy of a
file the suite runs elsewhere (scripts/docs.py checks the copy); every other Python block is run
here, so the docs' programs cannot rot.
"""
import importlib.util
import pathlib
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _docs_module():
    spec = importlib.util.spec_from_file_location("retrace_docs_check", ROOT / "scripts" / "docs.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def _python_blocks():
    docs = _docs_module()
    for page in docs.pages():
        for block in docs.code_blocks(page):
            if block.language == "python" and block.marker is None:
                yield pytest.param(block, id=f"{page.relative_to(ROOT)}:{block.line}")


@pytest.mark.parametrize("block", list(_python_blocks()))
def test_docs_python_block_runs(block):
    code = compile(block.text, f"{block.page}:{block.line}", "exec")
    exec(code, {"__name__": "__docs__"})  # noqa: S102 - the docs' own programs
