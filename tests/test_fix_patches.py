"""The guard written into the user's file (:func:`fuzz_core.fix_source.patch`): the call at the finding's
column, with the names the line holds, as a patch ``git apply`` takes; or the one reason there is none."""
from __future__ import annotations

import subprocess
from pathlib import Path

from fuzz_core.fix_source import Guard, patch

EPS = 1.1920929e-07


def _file(tmp_path: Path, text: str) -> Path:
    (tmp_path / "prog.py").write_text(text, encoding="utf-8")
    return tmp_path


def _patched(root: Path, guard: Guard) -> str:
    """The file after ``git apply`` of the guard's patch."""
    got, why = patch(guard, (root,))
    assert got is not None, why
    subprocess.run(["git", "init", "-q"], cwd=root, check=True)
    (root / "fix.diff").write_text(got["diff"])
    applied = subprocess.run(["git", "apply", "fix.diff"], cwd=root, capture_output=True, text=True)
    assert applied.returncode == 0, applied.stderr
    return (root / "prog.py").read_text(encoding="utf-8")


def test_the_call_at_the_column_alone_is_rewritten(tmp_path):
    root = _file(tmp_path, "import torch\ndef f(p, y):\n    return y * torch.log(p) + (1 - y) * torch.log(1 - p)\n")
    second = "    return y * torch.log(p) + (1 - y) * ".__len__() + 1
    after = _patched(root, Guard("clamp_min", "log", "prog.py:3", {"lo": EPS}, column=second))
    assert after.splitlines()[2] == ("    return y * torch.log(p) + (1 - y) * torch.log((1 - p).clamp_min(1.1920929e-07))")
    got, why = patch(Guard("clamp_min", "log", "prog.py:3", {"lo": EPS}, column=5), (root,))
    assert got is None and why == ("no call of log starts at column 5 on line 3 of prog.py (`return y * torch.log(p) + "
                                   "(1 - y) * torch.log((1 - p).clamp_min(1.1920929e-07))`) in a form the guard can "
                                   "rewrite (torch.log(...), .log(), an operator)")


def test_a_stable_rewrite_needs_the_softmax_on_the_line_and_says_so(tmp_path):
    root = _file(tmp_path, "import torch\ndef f(z):\n    p = torch.softmax(z, 1)\n    return torch.log(p).sum()\n")
    guard = Guard("stable_log", "log", "prog.py:4", column=12, source="softmax", origin="prog.py:3:9")
    got, why = patch(guard, (root,))
    assert got is None
    assert why == ("log_softmax needs the input of the softmax that computed `p`, and line 4 of prog.py does not hold "
                   "it (the softmax runs at prog.py:3:9)")
    root = _file(tmp_path, "import torch\ndef f(z):\n    return torch.log(torch.softmax(z, 1)).sum()\n")
    after = _patched(root, Guard("stable_log", "log", "prog.py:3", column=12, source="softmax"))
    assert after.splitlines()[2] == "    return torch.log_softmax(z, 1).sum()"


def test_the_file_s_own_names_for_torch_are_used(tmp_path):
    root = _file(tmp_path, "import torch as th\nimport torch.nn.functional as fn\n"
                           "def f(a, b, z):\n    return a / b + th.log(1 - th.sigmoid(z))\n")
    after = _patched(root, Guard("abs_min", "div", "prog.py:4", {"eps": EPS}, column=12))
    assert after.splitlines()[3] == ("    return a / th.copysign(b.abs().clamp_min(1.1920929e-07), b)"
                                     " + th.log(1 - th.sigmoid(z))")
    root = _file(tmp_path, "import torch as th\nimport torch.nn.functional as fn\n"
                           "def f(a, b, z):\n    return a / b + th.log(1 - th.sigmoid(z))\n")
    after = _patched(root, Guard("stable_log", "log", "prog.py:4", column=20, source="one_minus_sigmoid"))
    assert after.splitlines()[3] == "    return a / b + fn.logsigmoid(-z)"
    root = _file(tmp_path, "def f(a, b):\n    return a / b\n")                 # torch is not imported there
    got, why = patch(Guard("abs_min", "div", "prog.py:2", {"eps": EPS}, column=12), (root,))
    assert got is None and why == "the guard of a divisor needs torch.copysign, and the file does not import torch"


def test_a_call_over_several_lines_and_a_line_with_other_scripts(tmp_path):
    root = _file(tmp_path, "import torch\ndef f(x):\n    return torch.sqrt(\n        x - 1)\n")
    after = _patched(root, Guard("clamp_min", "sqrt", "prog.py:3", {"lo": 0.0}, column=12))
    assert after.splitlines()[2:4] == ["    return torch.sqrt(", "        (x - 1).clamp_min(0))"]
    root = _file(tmp_path, "import torch\ndef f(x):\n    s = 'é→'; return torch.rsqrt(x)\n")
    column = len("    s = 'é→'; return ") + 1                             # in characters, as the recorder counts
    after = _patched(root, Guard("clamp_min", "rsqrt", "prog.py:3", {"lo": EPS}, column=column))
    assert after.splitlines()[2] == "    s = 'é→'; return torch.rsqrt(x.clamp_min(1.1920929e-07))"


def test_no_patch_says_why(tmp_path):
    root = _file(tmp_path, "import torch\nf = torch.log\ndef g(x):\n    return f(x)\n    x.log_()\n")
    assert patch(Guard("clamp_min", "log", "prog.py:4", {"lo": EPS}, column=12), (root,))[1].startswith(
        "no call of log starts at column 12 on line 4 of prog.py (`return f(x)`)")
    assert patch(Guard("clamp_min", "log", "gone.py:4", {"lo": EPS}), (root,))[1] == (
        "gone.py is not found here (run `cdeepfuzz fix` in the folder the campaign ran in)")
    assert patch(Guard("clamp_min", "log", "prog.py:40", {"lo": EPS}), (root,))[1] == "prog.py has no line 40"
    root = _file(tmp_path, "import torch\ndef g(x):\n    (x + 1).log_()\n")
    assert patch(Guard("clamp_min", "log", "prog.py:3", {"lo": EPS}), (root,))[1] == (
        "the in-place log_ writes into an expression, which the guard cannot clamp in place")


def test_a_file_with_crlf_line_ends_keeps_them(tmp_path):
    (tmp_path / "prog.py").write_bytes(b"import torch\r\ndef f(x):\r\n    return torch.log(x)\r\n")
    got, _ = patch(Guard("clamp_min", "log", "prog.py:3", {"lo": EPS}, column=12), (tmp_path,))
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    (tmp_path / "fix.diff").write_bytes(got["diff"].encode())
    applied = subprocess.run(["git", "apply", "fix.diff"], cwd=tmp_path, capture_output=True, text=True)
    assert applied.returncode == 0, applied.stderr
    assert (tmp_path / "prog.py").read_bytes() == (b"import torch\r\ndef f(x):\r\n"
                                                  b"    return torch.log(x.clamp_min(1.1920929e-07))\r\n")


def test_an_input_in_parentheses_of_its_own_gets_no_second_pair(tmp_path):
    root = _file(tmp_path, "import torch\ndef f(p, g, c, h):\n    return ((1 - p) ** g + c / (h - 1)).sum() + torch.log((1 - p))\n")
    line = "    return ((1 - p) ** g + c / (h - 1)).sum() + torch.log((1 - p))"
    pow_, div, log = (line.index(t) + 1 for t in ("(1 - p) ** g", "c / (h", "torch.log"))
    after = lambda op, name, col, **p: patch(Guard(name, op, "prog.py:3", p, column=col), (root,))[0]["after"]  # noqa: E731
    assert after("pow", "clamp_min", pow_, lo=EPS).startswith("return ((1 - p).clamp_min(1.1920929e-07) ** g + c")
    assert "c / torch.copysign((h - 1).abs().clamp_min(1e-07), h - 1)).sum()" in after("div", "abs_min", div, eps=1e-7)
    assert after("log", "clamp_min", log, lo=EPS).endswith("torch.log((1 - p).clamp_min(1.1920929e-07))")
    root = _file(tmp_path, "import torch\ndef f(p):\n    return torch.log(1 - p)\n")
    assert patch(Guard("clamp_min", "log", "prog.py:3", {"lo": EPS}, column=12), (root,))[0]["after"] == (
        "return torch.log((1 - p).clamp_min(1.1920929e-07))")             # the call's own parentheses stay
