"""Configuration files through the real commands: a bad --config file is one line from train.py and from runner,
with nothing started; a training run writes its resolved config.toml, a score and a prediction theirs beside
their output, which `runner --config` replays into an equal RunConfig from any directory, and a run's log and
report name the files it read."""
import csv
import dataclasses
import json
import os
import shlex
import subprocess
import sys

import pytest

import train
from rn50kit.config import config_files, resolved_config, train_config
from rn50kit.launch import train_flags
from rn50kit.launch.machine import Machine
from rn50kit.launch.plan import plan_launch
from support.datasets import photo_folder
from support.processes import ROOT, run
from support.runs import configured

tomllib = config_files.tomllib  # the standard library's from Python 3.11 on, tomli on 3.10

pytestmark = pytest.mark.slow  # starts train.py and runner


TINY = ['data_backend = "synthetic"', 'dtype = "float32"', "num_layers = 18", "image_shape = [3, 32, 32]",
        "num_classes = 10"]


BAD_FILES = {  # what the file holds: what the one line must say
    "unknown key": ("\n".join(TINY + ["[lr_schedule]", 'lr_shedule = "step"']),
                    ["line 9", "unknown key 'lr_shedule'", "did you mean 'lr_schedule'?"]),
    "wrong type": ("\n".join(TINY + ["batch_size = 'many'"]), ["line 8", "batch_size = \"many\"",
                                                                "expected an integer"]),
    "out of range": ("\n".join(TINY + ["ema_decay = 1.5"]), ["--ema-decay must be in [0, 1), got 1.5",
                                                              "set by ema_decay in", "line 8"]),
    "bad choice": ("\n".join(TINY + ['lr_schedule = "exponential"']), ['lr_schedule = "exponential"',
                                                                        "not one of cosine, step, poly, linear"]),
    "syntax": ("\n".join(TINY + ["mom = 0.9 0.8"]), ["line 8, column 11", "not valid TOML"]),
    "missing": (None, ["does not exist"]),
    "unreadable": ("directory", ["cannot be read"]),
}


def assert_equal_configs(replayed, used, skip=("config",), typed_in=None):
    """``replayed`` and ``used`` (RunConfigs) field by field, but ``skip``; with ``typed_in`` (the directory
    ``used``'s command ran in), a path from the current directory compares as the absolute path it named."""
    for concern in train_config.CONFIGS:
        paths = resolved_config.FROM_CURRENT_DIRECTORY.get(concern, ())
        for field in dataclasses.fields(getattr(used, concern)):
            if field.name in skip:
                continue
            got, expected = getattr(getattr(replayed, concern), field.name), getattr(getattr(used, concern),
                                                                                   field.name)
            if typed_in is not None and field.name in paths and expected:
                expected = os.path.normpath(os.path.join(typed_in, expected))
            assert got == expected, f"{concern}.{field.name}: {got!r} != {expected!r}"


def bad_file(tmp_path, kind):
    """A run.toml with the fault ``kind`` (BAD_FILES), after two good lines (so its line numbers are 2 more)."""
    text = BAD_FILES[kind][0]
    path = tmp_path / "run.toml"
    if text == "directory":
        path.mkdir()
    elif text is not None:
        path.write_text(f'workspace = "{tmp_path / "ws"}"\nmode = "train"\n' + text + "\n")
    return path


@pytest.mark.parametrize("command", ["train.py", "runner"])
@pytest.mark.parametrize("kind", sorted(BAD_FILES))
def test_a_bad_config_file_is_one_line_and_starts_nothing(tmp_path, kind, command):
    path = bad_file(tmp_path, kind)
    ran = run([sys.executable, os.path.join(ROOT, command), "--config", str(path), "--num-examples", "16"],
              cwd=tmp_path)
    lines = ran.stderr.strip().splitlines()
    assert ran.returncode == 2 and len(lines) == 1 and "Traceback" not in ran.stderr, ran.stderr
    assert lines[0].startswith(f"{'runner' if command == 'runner' else 'train.py'}: error:") or \
        lines[0].startswith("train.py: error:"), lines[0]  # runner passes train.py's own line on
    assert str(path) in lines[0], lines[0]
    for says in BAD_FILES[kind][1]:
        assert says in lines[0], lines[0]
    assert not (tmp_path / "ws").exists() and ran.stdout == ""


def test_a_run_writes_its_config_and_runner_replays_it(tmp_path):
    workspace, config = tmp_path / "ws", tmp_path / "run.toml"
    config.write_text("\n".join(TINY + ["num_epochs = 1", "num_examples = 32", "[fit]", "batch_size = 16",
                                        'mode = "train"', "seed = 4", "[optimizer]", "mom = 0.8"]) + "\n")
    ran = run([os.path.join(ROOT, "runner"), "-n", "1", "--config", str(config), "--workspace", str(workspace),
               "--recipe", "he"], cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr[-3000:]
    resolved = workspace / "config.toml"
    with open(resolved, "rb") as f:
        written = tomllib.load(f)
    assert written["fit"]["mom"] == 0.8 and written["fit"]["optimizer"] == "nag" and written["runner"]["ngpus"] == 1
    assert written["kit"]["config_file"] == str(config) and written["kit"]["recipe_file"].endswith("recipes/he.toml")
    assert "version" in written["kit"] and not list(workspace.glob("*.tmp-*"))
    head = subprocess.run(["git", "-C", ROOT, "rev-parse", "HEAD"], capture_output=True, text=True)
    if head.returncode == 0:  # a checkout (an installed kit has no commit to record)
        assert written["kit"]["commit"] == head.stdout.strip()

    # The run's own record of every value it used (log.jsonl's params, written by another path) is the reference.
    params = next(json.loads(line) for line in open(workspace / "log.jsonl") if '"params"' in line)
    assert params["config_file"] == str(config) and params["recipe_file"] == written["kit"]["recipe_file"]
    report = json.load(open(workspace / "report.json"))
    assert report["info"]["config_file"] == str(config) and report["info"]["recipe_file"] == params["recipe_file"]
    used = train_config.from_args(train.argparse.Namespace(**{**dict.fromkeys(
        f.name for cls in train_config.CONFIGS.values() for f in dataclasses.fields(cls)), **params["args"]}))

    elsewhere = tmp_path / "again"
    args, _, command = plan_launch(["--config", str(resolved), "--workspace", str(elsewhere)],
                                   Machine(0, os.cpu_count() or 1), {})
    argv = train_flags.train_arguments(command)
    replayed = configured(argv)
    assert args.ngpus == 1
    assert_equal_configs(replayed, used, skip=("workspace", "config"))
    assert replayed.fit.workspace == str(elsewhere) and replayed.fit.config == str(resolved)


def readme_block(fence):
    """The first ```fence block of the "Configuration files" part of docs/training.md."""
    text = open(os.path.join(ROOT, "docs", "training.md")).read()
    part = text[text.index("## Configuration files"):]
    start = part.index(f"```{fence}\n") + len(fence) + 4
    return part[start:part.index("```", start)]


def test_the_docs_example_is_the_shipped_file():
    shipped = open(os.path.join(ROOT, "examples", "demo.toml")).read()
    assert shipped.endswith(readme_block("toml"))
    assert all(line.startswith("#") for line in shipped[:-len(readme_block("toml"))].splitlines())


def test_the_docs_commands_run_as_printed(tmp_path, digits_data, monkeypatch):
    """The demo's folders where the commands of docs/training.md expect them (data/demo from `make demo`, the kit's
    examples/), then each command as printed: a run from the file, and its config.toml replayed elsewhere; the
    file's relative paths are absolute in config.toml, which replays from another directory too."""
    (tmp_path / "data").mkdir()
    os.symlink(digits_data, tmp_path / "data" / "demo")
    os.symlink(os.path.join(ROOT, "examples"), tmp_path / "examples")
    for line in readme_block("bash").splitlines():
        words = shlex.split(line, comments=True)
        assert words[0] == "./runner"
        ran = run([os.path.join(ROOT, "runner"), *words[1:]], cwd=tmp_path)
        assert ran.returncode == 0, f"{line}\n{ran.stderr[-3000:]}"
    tables = []
    for name in ("demo-short", "demo-again"):
        with open(tmp_path / "runs" / name / "config.toml", "rb") as f:
            tables.append(tomllib.load(f))
    first, again = tables
    assert (first["runner"]["ngpus"], first["fit"]["batch_size"], first["fit"]["num_epochs"]) == (2, 64, 1)
    assert first["fit"].pop("workspace") == str(tmp_path / "runs" / "demo-short")
    assert again["fit"].pop("workspace") == str(tmp_path / "runs" / "demo-again")
    assert first["data"]["data_train"] == str(tmp_path / "data" / "demo" / "train.rec")
    assert again["kit"].pop("config_file") == str(tmp_path / "runs" / "demo-short" / "config.toml")
    first["kit"].pop("config_file")
    assert first == again

    monkeypatch.chdir(tmp_path)
    used = planned_worker_config(shlex.split(readme_block("bash").splitlines()[0], comments=True)[1:])
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    replayed = planned_worker_config(["--config", str(tmp_path / "runs" / "demo-short" / "config.toml"),
                                      "--workspace", "demo-elsewhere"])
    assert_equal_configs(replayed, used, skip=("workspace", "config"), typed_in=str(tmp_path))


def test_a_score_writes_its_config_beside_its_report_and_train_py_replays_it(tmp_path):
    workspace, config = tmp_path / "ws", tmp_path / "run.toml"
    config.write_text("\n".join(TINY + ["num_epochs = 1", "num_examples = 32", "batch_size = 16", "seed = 4"]) + "\n")
    trained = run([sys.executable, os.path.join(ROOT, "train.py"), "--config", str(config), "--workspace",
                   str(workspace)], cwd=tmp_path)
    assert trained.returncode == 0, trained.stderr[-3000:]
    score_argv = ["--config", str(config), "--workspace", str(workspace), "--mode", "val", "--load",
                  str(workspace / "model-0001.params"), "--batch-size", "8"]
    scored = run([sys.executable, os.path.join(ROOT, "train.py"), *score_argv], cwd=tmp_path)
    assert scored.returncode == 0, scored.stderr[-3000:]
    report, written = workspace / "model-0001.float32.score.json", workspace / "model-0001.float32.score.config.toml"
    assert report.is_file() and written.is_file() and not list(workspace.glob("*.tmp-*"))

    # A refused score (a flag the checkpoint contradicts) leaves the earlier score's files as they were.
    before = (report.read_bytes(), written.read_bytes())
    refused = run([sys.executable, os.path.join(ROOT, "train.py"), *score_argv, "--num-layers", "34"], cwd=tmp_path)
    assert refused.returncode == 2 and "Traceback" not in refused.stderr, refused.stderr[-2000:]
    assert (report.read_bytes(), written.read_bytes()) == before

    # The reference: what train.py builds from the scoring command line itself, in this process.
    used, replayed = configured(score_argv), configured(["--config", str(written)])
    assert_equal_configs(replayed, used)
    assert replayed.fit.mode == "val" and replayed.fit.batch_size == 8


def planned_worker_config(argv):
    """The RunConfig the worker builds from what runner plans for ``argv`` (in this process, this directory)."""
    args, _, command = plan_launch(argv, Machine(0, os.cpu_count() or 1), {})
    return configured(train_flags.train_arguments(command))


def test_a_prediction_writes_its_config_and_runner_replays_it_from_another_directory(tmp_path, monkeypatch):
    """Relative paths as a user types them: the prediction's config.toml (beside its CSV, a relative --pred-out
    from the current directory; one image's beside the checkpoint) holds them absolute, so runner replays it from
    another directory, with --workspace elsewhere."""
    config = tmp_path / "run.toml"
    config.write_text("\n".join(TINY + ["num_epochs = 1", "num_examples = 32", "batch_size = 16", "seed = 4"]) + "\n")
    trained = run([sys.executable, os.path.join(ROOT, "train.py"), "--config", "run.toml", "--workspace", "ws"],
                  cwd=tmp_path)
    assert trained.returncode == 0, trained.stderr[-3000:]
    photos = photo_folder(tmp_path / "photos")
    many = ["--mode", "pred", "--workspace", "ws", "--data-pred", "photos", "--pred-out", "out/rows.csv"]
    one = ["--mode", "pred", "--workspace", "ws", "--data-pred", "photos/b/3.jpg", "--pred-top-k", "3"]
    for argv in (many, one):
        predicted = run([os.path.join(ROOT, "runner"), *argv], cwd=tmp_path)
        assert predicted.returncode == 0 and "Traceback" not in predicted.stderr, predicted.stderr[-3000:]
    beside_rows, beside_checkpoint = tmp_path / "out" / "rows.config.toml", \
        tmp_path / "ws" / "model-0001.float32.pred.config.toml"
    assert beside_rows.is_file() and beside_checkpoint.is_file() and not list(tmp_path.rglob("*.tmp-*"))
    with open(beside_rows, "rb") as f:
        written = tomllib.load(f)
    assert written["predict"]["data_pred"] == str(photos)
    assert written["predict"]["pred_out"] == str(tmp_path / "out" / "rows.csv")
    assert written["fit"]["load"] == str(tmp_path / "ws" / "model-0001.params") and "version" in written["kit"]

    # The reference: what runner plans and the worker builds from each prediction's own command line, typed in
    # tmp_path; the replay is planned from another directory.
    monkeypatch.chdir(tmp_path)
    used = {"many": planned_worker_config(many), "one": planned_worker_config(one)}
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    for name, path in (("many", beside_rows), ("one", beside_checkpoint)):
        replayed = planned_worker_config(["--config", str(path), "--workspace", "again"])
        assert_equal_configs(replayed, used[name], skip=("workspace", "config"), typed_in=str(tmp_path))
        assert replayed.fit.workspace == "again" and replayed.fit.mode == "pred"
    assert used["one"].predict.pred_top_k == 3 and used["many"].predict.pred_out == "out/rows.csv"

    # And replayed for real from there: the same rows, into the file the prediction named.
    rows = {}

    def read_rows(where):
        with open(tmp_path / "out" / "rows.csv", newline="") as f:
            rows[where] = [{**row, "path": os.path.normpath(os.path.join(tmp_path, row["path"]))}
                           for row in csv.DictReader(f)]
    read_rows("first")
    (tmp_path / "out" / "rows.csv").unlink()
    again = run([os.path.join(ROOT, "runner"), "--config", str(beside_rows), "--workspace", "again"], cwd=elsewhere)
    assert again.returncode == 0, again.stderr[-3000:]
    read_rows("again")
    assert rows["again"] == rows["first"] and len(rows["first"]) == 8  # the broken image's row too


def test_runner_names_a_bad_key_before_the_plan_it_led_to(tmp_path):
    """A misspelt key for train.py in a file with no data: train.py's line on the key, not runner's on the data."""
    (tmp_path / "run.toml").write_text('[runner]\nngpus = 1\n[optimizer]\nmomentum = 0.8\n')
    ran = run([os.path.join(ROOT, "runner"), "--config", "run.toml", "--data-root", str(tmp_path / "none")],
              cwd=tmp_path)
    lines = ran.stderr.strip().splitlines()
    assert ran.returncode == 2 and len(lines) == 1 and "Traceback" not in ran.stderr, ran.stderr
    assert f"{tmp_path / 'run.toml'} line 4: unknown key 'momentum'" in lines[0], lines[0]


def test_a_run_without_a_seed_records_the_one_drawn_and_its_replay_is_the_same_run(tmp_path):
    """Issue 58: a run without --seed recorded none in config.toml, so its replay drew other weights and batches."""
    config = tmp_path / "run.toml"
    config.write_text("\n".join(TINY + ["num_epochs = 1", "num_examples = 64", "batch_size = 16"]) + "\n")
    losses = {}
    for workspace, argv in (("first", ["--config", "run.toml"]), ("again", ["--config", "first/config.toml"])):
        ran = run([sys.executable, os.path.join(ROOT, "train.py"), *argv, "--workspace", workspace], cwd=tmp_path)
        assert ran.returncode == 0, ran.stderr[-3000:]
        losses[workspace] = json.load(open(tmp_path / workspace / "report.json"))["metrics"]["train.loss"]
    with open(tmp_path / "first" / "config.toml", "rb") as f:
        seed = tomllib.load(f)["fit"]["seed"]
    assert isinstance(seed, int)
    assert losses["again"] == losses["first"]  # the same draws: weights, batches, augmentation


def readme_demo_command():
    """The README's demo run, `./runner ...` with its continuation lines joined, as words."""
    text = open(os.path.join(ROOT, "README.md")).read()
    start = text.index("./runner -n 2 -b 32 -e 16")
    return shlex.split(text[start:].replace("\\\n", " ").split("\n", 1)[0])


def test_the_shipped_demo_file_is_the_readmes_demo_run(tmp_path, digits_data, monkeypatch):
    """Issue 58: examples/demo.toml said it was the README's demo but left out its LR, augmentation and seed. What
    runner plans from the file is what it plans from the README's command (the workspace aside)."""
    (tmp_path / "data").mkdir()
    os.symlink(digits_data, tmp_path / "data" / "demo")
    monkeypatch.chdir(tmp_path)
    readme = readme_demo_command()
    assert readme[0] == "./runner" and "--seed" in readme
    from_file = planned_worker_config(["--config", os.path.join(ROOT, "examples", "demo.toml")])
    assert_equal_configs(from_file, planned_worker_config(readme[1:]), skip=("workspace", "config", "data_root"))
