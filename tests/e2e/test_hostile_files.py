"""Hostile files of every kind the kit reads besides records and images (issue 57), fuzzed by seed as
test_record_fuzz.py does records: a configuration file, a recipe and a workspace's config.toml (through train.py's
parse_args), a checkpoint's state.json and .params (checkpoint.inspect and check_loadable, the real checkpoint's
other files beside them), run.lock (run_lock.run_state and the busy message), a .safetensors header
(pretrained.read_weights), an .idx (records.read_index_arrays) and a class-name list (predict.read_names_file).
tests/hostile_files.py makes the cases (truncation, flipped bytes, inserted junk, an empty file, wrong types, huge
numbers, NaN and infinity, nesting past Python's recursion limit, wrong field counts) and judges each against an
independent reading of its bytes: accepted with what the file says, or refused by the kit's own error in one line
naming the file; never another exception, a traceback or a dead process."""
import collections
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from support.processes import HANG_S, ROOT, WORKERS, run, venv_env
from support.runs import TINY_RUN

pytestmark = pytest.mark.slow  # a tiny training run, then a process per kind

CASES = 60
SEED = 57
KINDS = ("config", "recipe", "workspace-config", "state", "run-lock", "safetensors", "params", "idx", "class-names")


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    """A finished tiny run's workspace: its checkpoint, config.toml and run.lock are the bases."""
    folder = tmp_path_factory.mktemp("run")
    result = run([sys.executable, os.path.join(ROOT, "train.py"), *TINY_RUN, "--batch-size", "8", "--num-examples",
                  "16", "--num-epochs", "1", "--seed", "3", "--workspace", str(folder)])
    assert result.returncode == 0, result.stderr[-3000:]
    return folder


def base_folder(kind, workspace, folder):
    """``folder`` with the kind's base file (``base``) and what its reader needs beside it."""
    folder.mkdir()
    if kind == "config":
        (folder / "base").write_text('batch_size = 64\nnum_epochs = 3\nlr = 0.1\ndtype = "float32"\n'
                                     "num_layers = 18\nwarmup_epochs = 1\n")
    elif kind == "recipe":
        shutil.copy(os.path.join(ROOT, "rn50kit", "config", "recipes", "he.toml"), folder / "base")
    elif kind == "workspace-config":
        shutil.copy(workspace / "config.toml", folder / "base")
    elif kind in ("state", "params"):
        for path in [*workspace.glob("model-0001.*"), workspace / "model-symbol.json"]:
            shutil.copy(path, folder / path.name)
        shutil.copy(folder / ("model-0001.state.json" if kind == "state" else "model-0001.params"), folder / "base")
    elif kind == "run-lock":
        shutil.copy(workspace / "run.lock", folder / "base")
        shutil.copy(workspace / "run.lock", folder / "run.lock")
    elif kind == "safetensors":
        from safetensors.numpy import save_file
        save_file({"conv.weight": np.arange(24, dtype=np.float32).reshape(2, 3, 2, 2),
                   "fc.bias": np.ones(5, np.float32)}, str(folder / "base"))
        shutil.copy(folder / "base", folder / "base.safetensors")  # the reader knows the format by its suffix
    elif kind == "idx":
        (folder / "base").write_text("".join(f"{i}\t{i * 4096}\n" for i in range(12)))
    else:
        (folder / "base").write_text("\n".join(["zero", "one", "two", "three", "four", "five", "six", "seven",
                                                "eight", "nine"]) + "\n")


def judged(kind, workspace, tmp_path):
    folder = tmp_path / kind
    base_folder(kind, workspace, folder)
    env = venv_env()
    env["PYTHONPATH"] = os.pathsep.join([os.path.join(ROOT, "tests"), env["PYTHONPATH"]])
    done = subprocess.run([sys.executable, os.path.join(WORKERS, "hostile_files.py"), kind, str(folder),
                           str(CASES), str(SEED)], env=env, capture_output=True, text=True, timeout=HANG_S, cwd=ROOT)
    lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    started = [line for line in lines if "start" in line]
    results = [line for line in lines if "done" in line]
    assert done.returncode == 0 and len(results) == CASES, \
        f"died in case {started[-1] if started else None}: {done.stderr[-3000:]}"
    return results


def findings(results):
    """Every case that is neither accepted as its bytes say nor refused in one line naming the file."""
    bad = []
    for result in results:
        if result["outcome"] == "accepted" and result["correct"] is not True:
            bad.append(f"accepted wrongly ({result['correct']}): {result['what']}")
        elif result["outcome"] == "refused" and (result["path"] not in result["message"] or
                                                 len(result["message"].strip().splitlines()) != 1):
            bad.append(f"refused without one line naming the file: {result['what']}: {result['message'][:300]}")
        elif result["outcome"] not in ("accepted", "refused"):
            bad.append(f"{result['outcome']}: {result['what']}: {result['message'][-600:]}")
    return bad


@pytest.mark.parametrize("kind", KINDS)
def test_hostile_files_are_read_right_or_refused_in_one_line(kind, workspace, tmp_path):
    results = judged(kind, workspace, tmp_path)
    counts = collections.Counter(result["outcome"] for result in results)
    print(f"{kind}: {len(results)} tried, {counts['refused']} refused, {counts['accepted']} accepted")
    assert findings(results) == []
    assert counts["refused"] > 0 or kind == "run-lock"  # the cases do damage: most are refused
