"""Every command block of README.md and docs/*.md marked `<!-- run: ... -->`, run as printed in a copy of the
checkout (its files as git lists them) with the demo data in data/demo: `run: demo` blocks on this CPU, in running
order (README first, then the pages in the guide's order: later blocks use the runs earlier ones made);
`run: dry-run` blocks (GPU and cluster commands) command by command with `--dry-run` appended, on an 8-GPU machine
as runner's planner describes it. A failing block names its file and line."""
import os
import shlex
import shutil
import subprocess

import pytest

from support.docs import doc_blocks, doc_files
from support.processes import LONG_HANG_S, ROOT, run, venv_env

pytestmark = pytest.mark.slow  # trains the demo and runs every command of the guide

RUN_BLOCKS = [block for path in doc_files() for block in doc_blocks(path)
              if (block["marker"] or "").startswith("run:")]

# Imported by every Python the dry-run commands start (runner, benchmark.py, the examples' runner): runner's planner
# sees an 8-GPU machine, since no GPU is here. Everything else (the flags, train.py's parser) is as on that machine.
EIGHT_GPUS = """from rn50kit.launch import machine
machine.detect_machine = lambda: machine.Machine(8, 64)
"""


def checkout_files():
    """The checkout's files as a clone would have them: tracked and new ones, none that git ignores."""
    listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"], cwd=ROOT,
                            capture_output=True, text=True, check=True).stdout
    return [name for name in listed.split("\0") if name and os.path.isfile(os.path.join(ROOT, name))]


@pytest.fixture(scope="module")
def kit(tmp_path_factory, digits_data):
    """A copy of the checkout with data/demo (the demo data, as tools/make_demo_data.py built it)."""
    out = tmp_path_factory.mktemp("docs") / "kit"
    for name in checkout_files():
        os.makedirs(os.path.dirname(out / name), exist_ok=True)
        shutil.copy2(os.path.join(ROOT, name), out / name)
    shutil.copytree(digits_data, out / "data" / "demo")
    return out


def environment(kit, *first):
    env = venv_env()  # this venv's bin first: `python`, `python3`, horovodrun
    env["PYTHONPATH"] = os.pathsep.join([*map(str, first), str(kit)])  # the copy's modules, not the checkout's
    return env


def commands(text):
    """The commands of a block: continuation lines joined, comments and blank lines dropped."""
    joined = text.replace("\\\n", " ")
    return [words for line in joined.splitlines() if (words := shlex.split(line, comments=True))]


def dry_run(words):
    extra = ["--dry-run"]
    if not any(word.startswith(("--data-root", "--data-train", "--config")) for word in words):
        extra += ["--data-root", "data/demo"]  # the default /data/imagenet/... is not here
    return [*words, *extra]


def where(block):
    return f"{block['file']}:{block['line']}"


@pytest.mark.parametrize("block", RUN_BLOCKS, ids=where)
def test_block_runs_as_printed(block, kit, tmp_path):
    kind = block["marker"].split(":", 1)[1].strip()
    if kind == "demo":
        script = tmp_path / "block.sh"
        script.write_text(block["text"] + "\n")
        ran = run(["bash", "-e", "-o", "pipefail", str(script)], env=environment(kit), cwd=kit,
                  timeout=LONG_HANG_S)
        assert ran.returncode == 0, f"{where(block)}: exit status {ran.returncode}\n{ran.stderr[-3000:]}"
        return
    assert kind == "dry-run", f"{where(block)}: unknown marker {block['marker']!r}"
    (tmp_path / "sitecustomize.py").write_text(EIGHT_GPUS)
    for words in commands(block["text"]):
        command = dry_run(words)
        ran = run(command, env=environment(kit, tmp_path), cwd=kit)
        assert ran.returncode == 0, f"{where(block)}: {shlex.join(command)}\n{ran.stderr[-3000:]}"
