"""The package's type stubs and annotations: mypy --strict accepts the Python programs of the
docs (README.md and docs/*.md), as a user's type-checked code would use retrace."""
import importlib.util
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _python_blocks():
    spec = importlib.util.spec_from_file_location("retrace_docs_typing", ROOT / "scripts" / "docs.py")
    docs = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = docs
    spec.loader.exec_module(docs)
    for page in docs.pages():
        for block in docs.code_blocks(page):
            if block.language == "python" and block.marker is None:
                yield page.relative_to(ROOT), block


def test_the_package_is_typed():
    import retrace

    package = pathlib.Path(retrace.__file__).parent
    assert (package / "py.typed").exists()
    assert (package / "_core" / "__init__.pyi").exists() and (package / "_core" / "ops.pyi").exists()


def test_mypy_strict_accepts_the_docs_programs(tmp_path):
    pytest.importorskip("mypy")
    files = []
    for i, (page, block) in enumerate(_python_blocks()):
        path = tmp_path / f"example_{i}_{page.stem}.py"
        path.write_text(block.text)
        files.append(str(path))
    assert files, "the docs have no Python programs"
    result = subprocess.run([sys.executable, "-m", "mypy", "--strict", "--no-incremental",
                             "--cache-dir", str(tmp_path / "cache"), *files],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
