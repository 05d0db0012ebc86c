"""The Python DiT demo: traced equals eager bit for bit (the docs' examples run in test_docs.py)."""
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
