"""The tree is lint-clean (ruff, pinned in setup.py, configured in pyproject.toml) and keeps the house's size
rule: no function over 80 lines in the kit, its tools and its tests."""
import ast
import os
import subprocess
import sys

from conftest import HANG_S, ROOT

MAX_FUNCTION_LINES = 80


def python_files():
    listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "*.py"], cwd=ROOT,
                            capture_output=True, text=True, timeout=HANG_S, check=True).stdout.split()
    return [os.path.join(ROOT, path) for path in listed + ["runner"] if os.path.isfile(os.path.join(ROOT, path))]


def test_ruff_finds_nothing():
    result = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "--output-format", "concise", ROOT],
                            cwd=ROOT, capture_output=True, text=True, timeout=HANG_S)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]


def long_functions(path):
    with open(path) as f:
        tree = ast.parse(f.read(), path)
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            length = node.end_lineno - node.lineno + 1
            if length > MAX_FUNCTION_LINES:
                yield f"{os.path.relpath(path, ROOT)}:{node.lineno} {node.name} ({length} lines)"


def test_no_function_over_80_lines():
    found = [line for path in python_files() for line in long_functions(path)]
    assert not found, "split these: " + "; ".join(found)


def test_the_size_rule_sees_a_long_function(tmp_path):
    """The check itself: a function of 81 lines is found, one of 80 is not."""
    body = "\n".join(f"    x{i} = {i}" for i in range(79))
    (tmp_path / "long.py").write_text(f"def long():\n{body}\n    return 0\n")
    (tmp_path / "short.py").write_text(f"def short():\n{body}\n")
    assert [line.split(" ")[1] for line in long_functions(str(tmp_path / "long.py"))] == ["long"]
    assert not list(long_functions(str(tmp_path / "short.py")))
