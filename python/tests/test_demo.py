"""The Python DiT demo: traced equals eager bit for bit; the README's example runs."""
import pathlib
import re

import retrace.demo


def test_demo_small(capsys):
    assert retrace.demo.main(["--steps", "3", "--depth", "1", "--hidden", "64", "--heads", "2",
                              "--input-size", "8", "--classes", "10"]) == 0
    out = capsys.readouterr().out
    assert out.count("traced == eager bit for bit") == 2
    assert "live traces: 2" in out


def test_demo_bfloat16_without_guidance(capsys):
    assert retrace.demo.main(["--steps", "2", "--depth", "1", "--hidden", "64", "--heads", "2",
                              "--input-size", "8", "--classes", "10", "--dtype", "bfloat16",
                              "--cfg-scale", "1"]) == 0
    assert "no guidance" in capsys.readouterr().out


def test_readme_python_example():
    readme = pathlib.Path(__file__).resolve().parents[2] / "README.md"
    blocks = re.findall(r"```python\n(.*?)```", readme.read_text(), re.S)
    assert blocks, "README has no Python example"
    for block in blocks:
        exec(compile(block, "README.md", "exec"), {})
