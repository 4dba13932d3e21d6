"""A newcomer's path through the README: starting afresh, keeping a few checkpoints, scoring and predicting with
what the checkpoint knows, the same defaults with and without runner, the recipe's LR through runner, a live
progress bar when rank 0's output is a terminal, and warnings about a batch larger than the data."""
import glob
import json
import os
import pty
import re
import sys

import numpy as np
import pytest

from rn50kit.data.record_files import class_count_problem
from rn50kit.training import announce
from rn50kit.training.workspace import set_aside_superseded
from support.datasets import labelled_records
from support.processes import ROOT, run, venv_env
from support.runs import record_config, value_after


@pytest.mark.slow  # a heavier in-process test (the fast lane stays under a minute)
def test_a_batch_larger_than_the_data_and_class_names_of_the_wrong_length_are_warned_about(tmp_path, caplog):
    """Found by the second newcomer walk (issue 26)."""
    import mxnet as mx

    from rn50kit.scoring import predict
    files = labelled_records(tmp_path, [i % 10 for i in range(20)])
    with caplog.at_level("WARNING"):
        announce.warn_about(record_config(files, "dali-cpu", 10).replace(fit__batch_size=32), primary=True)
    assert "--batch-size 32 (global) is larger than the 20 training records" in caplog.text
    caplog.clear()
    net = mx.gluon.nn.Dense(4)
    net.initialize()
    with caplog.at_level("WARNING"):
        predict.predict(net, np.ones((1, 3), "float32"), mx.cpu(), "float32", names=["a", "b", "c", "d"])
        assert "class names" not in caplog.text
        predict.predict(net, np.ones((1, 3), "float32"), mx.cpu(), "float32", names=["a", "b", "c"])
    assert "3 class names (--class-names, or the .lst beside --data-train) for a network of 4 classes" in caplog.text


pytestmark = pytest.mark.slow  # launches processes or trains end to end


TRAIN = os.path.join(ROOT, "train.py")


RUNNER = os.path.join(ROOT, "runner")


# A small synthetic run (learnable labels; validation on fresh images): seconds per process.
SYNTHETIC = ["--data-backend", "synthetic", "--num-layers", "18", "--num-classes", "4", "--image-shape", "3,16,16",
             "--batch-size", "8", "--num-examples", "16", "--warmup-epochs", "0", "--lr", "0.05", "--seed", "1"]


def ok(result):
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    return result


def report(path):
    with open(path) as f:
        return json.load(f)


def params_record(workspace):
    with open(os.path.join(workspace, "log.jsonl")) as f:
        return next(json.loads(line) for line in f if '"params"' in line)["args"]


def checkpoint_epochs(workspace):
    return sorted(int(m.group(1)) for p in os.listdir(workspace)
                  for m in [re.match(r"model-(\d{4})\.state\.json$", p)] if m)


def test_keep_last_then_resume_none_sets_the_old_run_aside(tmp_path):
    ws = tmp_path / "ws"
    ok(run([sys.executable, TRAIN, *SYNTHETIC, "--num-epochs", "4", "--keep-last", "2", "--workspace", str(ws)]))
    assert checkpoint_epochs(ws) == [3, 4]  # 1 and 2 removed when superseded
    assert not glob.glob(str(ws / "model-0001*")) and not glob.glob(str(ws / "model-0002*"))
    assert (ws / "model-best.params").is_file() and (ws / "model-symbol.json").is_file()

    fresh = ok(run([sys.executable, TRAIN, *SYNTHETIC, "--num-epochs", "2", "--resume", "none",
                    "--workspace", str(ws)]))
    assert "Resuming" not in fresh.stderr
    assert checkpoint_epochs(ws) == [1, 2]
    aside = glob.glob(str(ws / "previous-*"))
    assert len(aside) == 1, os.listdir(ws)
    assert checkpoint_epochs(aside[0]) == [3, 4]
    assert os.path.isfile(os.path.join(aside[0], "report.json"))
    assert len(report(ws / "report.json")["metrics"]["val.top1"]) == 2

    # The plain rerun continues the fresh run, never the old model-0004.
    again = ok(run([sys.executable, TRAIN, *SYNTHETIC, "--num-epochs", "2", "--workspace", str(ws)]))
    assert "All 2 epochs are done already" in again.stderr
    assert len(report(ws / "report.json")["metrics"]["val.top1"]) == 2
    assert checkpoint_epochs(ws) == [1, 2]


def demo_flags(digits):
    return ["--num-layers", "18", "--num-classes", "10", "--image-shape", "3,32,32", "--data-val-resize", "32"]


@pytest.fixture(scope="module")
def trained(digits_data, tmp_path_factory):
    """train.py alone, as the README's newcomer runs it on a CPU machine: --data-root, no backend, no .idx, no
    workspace. Returns (the directory it ran in, its workspace)."""
    cwd = tmp_path_factory.mktemp("newcomer")
    ok(run([sys.executable, TRAIN, "--data-root", str(digits_data), *demo_flags(digits_data), "--batch-size", "32",
            "--num-epochs", "2", "--lr", "0.1", "--warmup-epochs", "0", "--num-examples", "320",
            "--min-random-area", "0.5", "--random-mirror", "0", "--seed", "2", "--dali-threads", "1",
            "--dali-validation-threads", "1"], cwd=cwd))
    return cwd, cwd / "runs" / "resnet18_v1.5"


def test_train_py_alone_takes_runners_defaults(trained, digits_data):
    cwd, ws = trained
    args = params_record(ws)
    _, command = runner_dry_run("--data-root", str(digits_data))
    assert args["data_backend"] == value_after(command, "--data-backend")  # dali-cpu here, dali-gpu with a GPU
    assert args["dtype"] == value_after(command, "--dtype")
    assert args["data_train_idx"] == str(digits_data / "train.idx") == value_after(command, "--data-train-idx")
    assert args["data_val_idx"] == str(digits_data / "val.idx")
    assert args["workspace"] == os.path.join("runs", "resnet18_v1.5")
    assert checkpoint_epochs(ws) == [1, 2]


def test_scoring_takes_model_classes_shape_and_resize_from_the_checkpoint(trained, digits_data):
    cwd, ws = trained
    result = ok(run([sys.executable, TRAIN, "--mode", "val", "--load", str(ws / "model-best.params"),
                     "--data-root", str(digits_data), "--dali-validation-threads", "1"], cwd=cwd))
    scored = report(ws / "model-best.float32.score.json")  # beside the checkpoint, not in the current directory
    assert not (cwd / "score.json").exists()
    trained_top1 = report(ws / "report.json")["metrics"]["val.top1"]
    # The best checkpoint scored with the checkpoint's own settings gives what training measured for it.
    assert scored["metrics"]["val.top1"] == [pytest.approx(max(trained_top1), abs=1e-9)]
    assert "resnet18_v1.5" in result.stderr and "resize 32" in result.stderr
    # A flag contradicting the checkpoint is one line, before any work.
    refused = run([sys.executable, TRAIN, "--mode", "val", "--load", str(ws / "model-0002.params"),
                   "--data-root", str(digits_data), "--data-val-resize", "256"], cwd=cwd)
    errors = [line for line in refused.stderr.splitlines() if "error:" in line]
    assert refused.returncode == 2 and len(errors) == 1 and "Traceback" not in refused.stderr
    assert "--data-val-resize 256" in errors[0] and "--data-val-resize 32" in errors[0]


def top5(stdout):
    return [line for line in stdout.splitlines() if "% -> " in line]


def test_prediction_needs_only_the_checkpoint_and_the_image(trained, digits_data):
    cwd, ws = trained
    image = sorted((digits_data / "raw" / "val" / "3").glob("*.jpg"))[0]
    bare = ok(run([sys.executable, TRAIN, "--mode", "pred", "--load", str(ws / "model-0002.params"),
                   "--data-pred", str(image), "--data-train", str(digits_data / "train.rec")], cwd=cwd))
    explicit = ok(run([sys.executable, TRAIN, "--mode", "pred", "--load", str(ws / "model-0002.params"),
                       "--data-pred", str(image), "--data-train", str(digits_data / "train.rec"),
                       *demo_flags(digits_data)], cwd=cwd))
    assert len(top5(bare.stdout)) == 5 and top5(bare.stdout) == top5(explicit.stdout)
    assert not (cwd / "runs" / "resnet50_v1.5").exists()  # nothing made for the default model


def test_score_script_with_only_the_data_root(trained, digits_data):
    cwd, ws = trained
    result = ok(run([os.path.join(ROOT, "examples", "SCORE_FP32.sh"), str(ws / "model"), "2", "--data-root",
                     str(digits_data), "--dali-validation-threads", "1"], cwd=cwd))
    assert (ws / "model-0002.float32.score.json").is_file(), result.stderr[-2000:]
    assert report(ws / "model-0002.float32.score.json")["metrics"]["val.top1"] == \
        [pytest.approx(report(ws / "report.json")["metrics"]["val.top1"][-1], abs=1e-9)]


# --- runner ---

def runner_dry_run(*args):
    result = ok(run([sys.executable, RUNNER, *args, "--dry-run"]))
    *env_lines, command = result.stdout.strip().splitlines()
    return dict(line.split("=", 1) for line in env_lines), command.split()


def test_runner_leaves_the_lr_to_the_recipe_unless_given():
    _, command = runner_dry_run("-n", "2", "-b", "32", "--data-backend", "synthetic", "--recipe", "he")
    assert "--lr" not in command
    _, command = runner_dry_run("-n", "2", "-b", "32", "-l", "0.5", "--data-backend", "synthetic", "--recipe", "he")
    assert float(value_after(command, "--lr")) == pytest.approx(0.5 * 64 / 256)


def test_runner_refuses_an_unknown_flag_once_before_starting_workers(tmp_path):
    result = run([sys.executable, RUNNER, "-n", "2", "-b", "2", "--data-backend", "synthetic", "--no-such-flag", "1",
                  "--workspace", str(tmp_path)])
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "unrecognized arguments: --no-such-flag" in lines[0], result.stderr
    assert not os.listdir(tmp_path)


def test_help_texts_show_one_default_and_the_recipes():
    text = ok(run([sys.executable, TRAIN, "--help"])).stdout
    flat = " ".join(text.split())
    assert "(default: None)" not in flat and "(default: True)" not in flat and "(default: False)" not in flat
    assert "momentum (recipe: 0.875 (nvidia), 0.9 (nvidia-2019), 0.9 (he), 0.9 (mlperf)" in flat
    for entry in re.split(r"\n  (?=-)", text):  # one entry per flag
        assert " ".join(entry.split()).count("(default") <= 1, entry
    runner_help = " ".join(ok(run([sys.executable, RUNNER, "--help"])).stdout.split())
    assert "goes to train.py" in runner_help and "--workspace" in runner_help and "--resume" in runner_help
    assert "(default: None)" not in runner_help


def read_all(fd):
    out = b""
    while True:
        try:
            chunk = os.read(fd, 65536)
        except OSError:  # EIO: the child side closed
            return out
        if not chunk:
            return out
        out += chunk


def test_runner_on_a_terminal_shows_rank_0s_live_bar_without_prefixes(tmp_path):
    """Under a pseudo-terminal, as a user at a shell: the bar is redrawn in place (carriage returns), rank 0's
    lines carry no launcher prefix, and the recipe's LR per 256 images reaches train.py."""
    ws = tmp_path / "ws"
    command = [sys.executable, RUNNER, "-n", "2", "-b", "4", "-e", "1", "--recipe", "he", "--data-backend",
               "synthetic", "--num-layers", "18", "--num-classes", "4", "--image-shape", "3,16,16",
               "--num-examples", "48", "--lr-schedule", "cosine", "--workspace", str(ws)]
    pid, fd = pty.fork()
    if pid == 0:  # the child: runner with the pty as its terminal
        os.execve(sys.executable, command, venv_env())
    output = read_all(fd).decode(errors="replace")
    _, status = os.waitpid(pid, 0)
    os.close(fd)
    assert os.waitstatus_to_exitcode(status) == 0, output[-3000:]
    assert re.search(r"\rEpoch\[1/1\] \[#*\.*\] \d+/6 ", output), output[-3000:]  # epoch of epochs, step of steps
    assert "[0]<stderr>" not in output and "[0]<stdout>" not in output
    assert "Training resnet18_v1.5" in output and "Start with arguments" not in output
    assert "--warmup-epochs 5 is not shorter than --num-epochs 1" in output  # he's 5 warmup epochs
    assert params_record(ws)["lr"] == pytest.approx(0.1 * 8 / 256)  # recipe he: 0.1 per 256 images


# --- in-process units: checkpoints pruned, class counts ---

def save_checkpoints(prefix, tags):
    import mxnet as mx

    from rn50kit.weights import checkpoint
    net = mx.gluon.nn.HybridSequential()
    net.add(mx.gluon.nn.Dense(3, in_units=2))
    net.initialize()
    net.hybridize()
    net(mx.nd.zeros((1, 2)))
    trainer = mx.gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1})
    for epoch, step in tags:
        checkpoint.save(str(prefix), net, trainer, {"epoch": epoch, "step": step}, best=(epoch == 1 and not step))


def test_prune_removes_superseded_step_checkpoints_and_old_epochs(tmp_path):
    from rn50kit.weights import checkpoint
    prefix = tmp_path / "model"
    save_checkpoints(prefix, [(1, 0), (1, 7), (2, 0)])
    checkpoint.prune(str(prefix), keep_last=3)
    assert [(s["epoch"], s["step"]) for s in checkpoint.list_complete(str(prefix))] == [(1, 0), (2, 0)]
    assert not glob.glob(str(tmp_path / "model-0001-step*"))  # every file of the step checkpoint
    save_checkpoints(prefix, [(2, 5)])  # stopped by a signal inside epoch 3: the newest, kept
    checkpoint.prune(str(prefix), keep_last=1)
    assert [(s["epoch"], s["step"]) for s in checkpoint.list_complete(str(prefix))] == [(2, 0), (2, 5)]
    assert sorted(os.listdir(tmp_path)) == sorted(
        ["model-best.params", "model-symbol.json"] +
        [f"model-{tag}.{ext}" for tag in ("0002", "0002-step000005") for ext in ("params", "states", "state.json")])


def test_num_classes_checked_against_the_lst(tmp_path):
    import argparse

    rec = tmp_path / "train.rec"
    (tmp_path / "train.lst").write_text("".join(f"{i}\t{i % 3}\tc{i % 3}/{i}.jpg\n" for i in range(9)))
    args = argparse.Namespace(data_train=str(rec), data_val=None, num_classes=1000)
    error, warning = class_count_problem(args.data_train, args.data_val, args.num_classes)
    assert error is None and "3 classes" in warning and "--num-classes 3" in warning
    args.num_classes = 2
    error, warning = class_count_problem(args.data_train, args.data_val, args.num_classes)
    assert "labels up to 2" in error and warning is None
    args.num_classes = 3
    assert class_count_problem(args.data_train, args.data_val, args.num_classes) == (None, None)


def test_resume_from_an_older_checkpoint_sets_the_later_ones_aside(tmp_path):
    from rn50kit.weights import checkpoint
    prefix = tmp_path / "model"
    save_checkpoints(prefix, [(1, 0), (2, 0), (3, 0), (3, 4)])
    older = checkpoint.read_state(str(tmp_path / "model-0002.state.json"))
    aside = set_aside_superseded(str(tmp_path), "model", older)
    assert [(s["epoch"], s["step"]) for s in checkpoint.list_complete(str(prefix))] == [(1, 0), (2, 0)]
    assert [(s["epoch"], s["step"]) for s in checkpoint.list_complete(os.path.join(aside, "model"))] == \
        [(3, 0), (3, 4)]
    assert (tmp_path / "model-symbol.json").is_file() and (tmp_path / "model-best.params").is_file()


def test_bfloat16_on_a_cpu_without_avx512_is_one_line(tmp_path):
    from rn50kit.config import settings
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nflags\t\t: fpu sse2 avx avx2 fma\n")
    assert "avx512f" in settings.bfloat16_unsupported(str(cpuinfo))
    cpuinfo.write_text("flags\t\t: avx2 avx512f avx512dq avx512bw avx512vl avx512_vnni\n")
    assert settings.bfloat16_unsupported(str(cpuinfo)) is None
    if settings.bfloat16_unsupported() is None:
        return  # this CPU runs bfloat16: tests/e2e/test_reduced_precision.py trains with it
    result = run([sys.executable, TRAIN, *SYNTHETIC, "--dtype", "bfloat16", "--workspace", str(tmp_path / "ws")])
    errors = [line for line in result.stderr.splitlines() if "error:" in line]
    assert result.returncode == 2 and len(errors) == 1 and "AVX-512" in errors[0], result.stderr[-2000:]
    assert "Traceback" not in result.stderr
