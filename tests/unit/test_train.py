"""The second newcomer walk (issue 26): what trained silently wrong, and what crashed where one line belongs."""
import os

import numpy as np
import pytest

from conftest import write_record_file
from rn50kit.common import backends
from rn50kit.common import cli
from rn50kit.config import train_config
from rn50kit.common import schedules
import train


def labelled_records(folder, labels):
    """train.rec/.idx and val.rec/.idx with the given labels and no .lst (as check_dataset.py --fix writes)."""
    rng = np.random.RandomState(0)
    images = [rng.randint(0, 255, size=(8, 8, 3), dtype=np.uint8) for _ in labels]
    files = {}
    for split in ("train", "val"):
        files[split] = write_record_file(str(folder / split), images, labels)
    assert not list(folder.glob("*.lst"))
    return files


def record_config(files, backend, num_classes):
    return train_config.RunConfig().replace(
        data__data_backend=backend, data__data_train=files["train"][0], data__data_train_idx=files["train"][1],
        data__data_val=files["val"][0], data__data_val_idx=files["val"][1], model__num_classes=num_classes,
        fit__num_epochs=1, fit__warmup_epochs=0)


@pytest.mark.parametrize("backend", [name for name, row in backends.BACKENDS.items() if row.reads_records])
def test_class_count_below_the_record_labels_is_refused_without_a_lst(tmp_path, backend, caplog):
    files = labelled_records(tmp_path, [i % 10 for i in range(20)])
    with pytest.raises(cli.UsageError, match="labels up to 9 but --num-classes is 5; use --num-classes 10"):
        train.warn_about(record_config(files, backend, 5), primary=True)
    train.warn_about(record_config(files, backend, 10), primary=True)  # the right count passes
    with caplog.at_level("WARNING"):
        train.warn_about(record_config(files, backend, 12), primary=True)
    assert "the data has 10 classes" in caplog.text


def test_model_best_holds_the_ema_weights_that_were_scored(tmp_path):
    import mxnet as mx
    import fit
    import models
    from test_fit_phases import Batches, CPU, RUN, start, tiny_net, weights
    parsed = train.parse_args(["--kv-store", "local", "--dtype", "float32", "--batch-size", "8", "--num-epochs", "1",
                               "--lr", "0.2", "--warmup-epochs", "0", "--num-classes", "4", "--seed", "3",
                               "--ema-decay", "0.9", "--workspace", str(tmp_path), "--disp-batches", "0"])
    train.fill_hyper_parameters(parsed)
    args = train_config.from_args(parsed).fit
    net = tiny_net(tmp_path / "init.params")
    state, loop = start(args, net)
    fit.train_one_epoch(args, loop, state, Batches(), epoch=0)
    val = Batches(steps=2)
    scored = fit.validate(net, state.ema, val, CPU, loop.dist, "float32", no_metrics=False)
    live = weights(net)
    fit.save_checkpoint(str(tmp_path / "model"), net, state, RUN, epoch=1, step=0, keep_last=0, seed=3, best=True)
    assert weights(net).keys() == live.keys() and all(
        np.array_equal(value, live[name]) for name, value in weights(net).items())  # live weights put back
    best = tiny_net(tmp_path / "init.params")
    models.load_parameters(best, str(tmp_path / "model-best.params"), CPU)
    for name, value in weights(best).items():
        np.testing.assert_allclose(value, state.ema.shadow[name].asnumpy(), rtol=1e-6, err_msg=name)
    from rn50kit.scoring import scoring
    assert scoring.evaluate(best, val, CPU, loop.dist, "float32")["top1"] == scored["top1"]
    assert any(not np.allclose(value, live[name]) for name, value in weights(best).items())


def built(num_layers, image, dtype="float32"):
    import mxnet as mx
    import models
    net = models.build_network(models.ModelConfig(num_layers=num_layers), 3, "NCHW", dtype)
    net.initialize(mx.init.Xavier(), ctx=mx.cpu())
    net.hybridize()
    net.infer_shape(mx.nd.zeros((1, 3, image, image), dtype="float16" if dtype == "float16" else "float32"))
    return net


def test_memory_estimate_refuses_a_batch_that_cannot_fit_and_names_one_that_does():
    from rn50kit.launch import memory
    net = built(50, 224)
    gib = 2 ** 30
    # The run: ResNet-50, 224 px, batch 192 on a 24 GB machine (it grew to 21 GB resident).
    problem, need = memory.check(net, (1, 3, 224, 224), "float32", 192, 1, 1, 16 * gib, "this machine")
    assert need > 16 * gib and problem.startswith("training needs about")
    fits = int(problem.split("--batch-size ")[1].split()[0])
    assert 0 < fits < 192 and memory.check(net, (1, 3, 224, 224), "float32", fits, 1, 1, 16 * gib, "m")[0] is None
    assert memory.check(net, (1, 3, 224, 224), "float32", fits + 8, 1, 1, 16 * gib, "m")[0] is not None
    # The original's batches on a 16 GB V100 (15.8 GiB usable): float16 208 and float32 96 fit, float32 208 does not.
    v100 = 15.78 * gib
    assert memory.check(net, (1, 3, 224, 224), "float16", 208, 1, 1, v100, "GPU 0")[0] is None
    assert memory.check(net, (1, 3, 224, 224), "float32", 96, 1, 1, v100, "GPU 0")[0] is None
    assert memory.check(net, (1, 3, 224, 224), "float32", 208, 1, 1, v100, "GPU 0")[0] is not None
    # Activations scale with the image and the batch, by layer: ResNet-18 at 32 px holds 1/49 of 224 px's.
    small = built(18, 32)
    assert memory.activation_elements(small, (1, 3, 32, 32)) * 40 < memory.activation_elements(built(18, 224),
                                                                                                (1, 3, 224, 224))


def test_train_refuses_in_one_line_a_batch_the_machine_cannot_hold(monkeypatch):
    import mxnet as mx
    from rn50kit.training import distributed
    from rn50kit.launch import memory
    monkeypatch.setattr(memory, "cpu_budget", lambda processes: 1 * 2 ** 30)
    cfg = train_config.RunConfig().replace(fit__batch_size=4096, fit__mode="train", data__image_shape=(3, 32, 32))
    net = built(18, 32)
    with pytest.raises(cli.UsageError, match=r"this machine has 1.0 GiB; use --batch-size \d+ \(global"):
        train.check_memory(cfg, net, [mx.cpu()], distributed.Distributed(None))
    train.check_memory(cfg.replace(fit__batch_size=8), net, [mx.cpu()], distributed.Distributed(None))
    train.check_memory(cfg.replace(fit__memory_check="warn"), net, [mx.cpu()], distributed.Distributed(None))


def test_cpu_defaults_are_a_batch_a_cpu_can_run():
    from rn50kit.config import settings
    from rn50kit.launch import launcher
    args = train.parse_args([])
    settings.machine_defaults(args, num_gpus=0, given=set())
    assert (args.batch_size, args.dtype, args.data_backend) == (settings.CPU_BATCH_SIZE, "float32", "dali-cpu")
    args = train.parse_args(["--batch-size", "192"])
    settings.machine_defaults(args, num_gpus=0, given={"batch_size"})
    assert args.batch_size == 192  # typed: kept
    args = train.parse_args([])
    settings.machine_defaults(args, num_gpus=8, given=set())
    assert (args.batch_size, args.dtype) == (192, "float16")
    cpu, gpus = launcher.Machine(gpus=0, cores=2), launcher.Machine(gpus=8, cores=64)
    assert "--batch-size 32" in " ".join(launcher.plan_launch(["--data-backend", "synthetic"], cpu, {})[2])
    assert "--batch-size 1536" in " ".join(launcher.plan_launch(["--data-backend", "synthetic", "-n", "8"], gpus, {})[2])


# --- item 4: Ctrl-C on train.py, and the lock of a run that did not end cleanly --------------------------------

def start_train(tmp_path, *flags):
    import subprocess
    import sys
    from conftest import ROOT, TINY_RUN, venv_env
    out, err = open(tmp_path / "run.out", "w"), open(tmp_path / "run.err", "w")
    command = [sys.executable, os.path.join(ROOT, "train.py"), *TINY_RUN, "--batch-size", "8", "--disp-batches", "1",
               "--workspace", str(tmp_path / "ws"), "--warmup-epochs", "0", *flags]
    return subprocess.Popen(command, env=venv_env(), stdout=out, stderr=err, text=True, start_new_session=True)


def steps_logged(workspace):
    log = workspace / "log.jsonl"
    return log.exists() and sum(1 for line in open(log) if '"type": "iter"' in line)


@pytest.mark.slow
def test_ctrl_c_on_train_py_saves_a_step_checkpoint_and_exits_130(tmp_path):
    import signal
    from rn50kit.reliability import run_lock
    from conftest import HANG_S, wait_until
    process = start_train(tmp_path, "--num-epochs", "2", "--num-examples", "100000")
    try:
        wait_until(lambda: steps_logged(tmp_path / "ws") >= 2, "two training steps", process=process)
        process.send_signal(signal.SIGINT)
        status = process.wait(timeout=HANG_S)
    finally:
        if process.poll() is None:
            process.kill()
    err = (tmp_path / "run.err").read_text()
    assert status == 130, err[-3000:]
    assert "Traceback" not in err and "KeyboardInterrupt" not in err
    assert "Stopped by Ctrl-C (SIGINT) after saving a checkpoint" in (tmp_path / "run.out").read_text()
    assert [p.name.split("-step")[0] for p in (tmp_path / "ws").glob("model-*-step*.state.json")] == ["model-0000"]
    assert run_lock.run_state(str(tmp_path / "ws"))["state"] == "stopped"


@pytest.mark.slow
def test_ctrl_c_during_start_up_is_one_line_and_130(tmp_path):
    import signal
    from conftest import HANG_S, catches_signal, wait_until
    process = start_train(tmp_path, "--num-epochs", "1")
    try:
        wait_until(lambda: catches_signal(process.pid, signal.SIGTERM), "train.py to catch SIGTERM",
                   process=process, interval=0.005)  # its first lines, where SIGINT gets its handler too
        process.send_signal(signal.SIGINT)
        status = process.wait(timeout=HANG_S)
    finally:
        if process.poll() is None:
            process.kill()
    err = (tmp_path / "run.err").read_text()
    assert status == 130 and err.strip().splitlines()[-1].startswith("train.py: interrupted (Ctrl-C)"), err[-3000:]
    assert "Traceback" not in err


HOLD_THEN = """
import sys, time
sys.path.insert(0, sys.argv[2])
from rn50kit.reliability import run_lock
run_lock.WorkspaceLock(sys.argv[1]).acquire()
print("held", flush=True)
if sys.argv[3] == "fail":
    raise RuntimeError("a crash")
time.sleep(600)
"""


@pytest.mark.slow
def test_a_lock_whose_holder_crashed_or_was_killed_does_not_read_running(tmp_path):
    import subprocess
    import sys
    from rn50kit.reliability import run_lock
    from conftest import HANG_S, ROOT, pid_gone, wait_until
    failed, killed = tmp_path / "failed", tmp_path / "killed"
    failed.mkdir(), killed.mkdir()
    result = subprocess.run([sys.executable, "-c", HOLD_THEN, str(failed), ROOT, "fail"], capture_output=True,
                            text=True, timeout=HANG_S)
    assert result.returncode == 1 and run_lock.run_state(str(failed))["state"] == "failed"
    holder = subprocess.Popen([sys.executable, "-c", HOLD_THEN, str(killed), ROOT, "sleep"], stdout=subprocess.PIPE,
                              text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        assert run_lock.run_state(str(killed))["state"] == "running"  # alive: it is
    finally:
        holder.kill()  # SIGKILL: nothing of it runs again
        holder.wait()
    wait_until(lambda: pid_gone(holder.pid), "the killed holder to be gone")
    assert run_lock.read_record(run_lock.lock_path(str(killed)))["state"] == "running"  # what it last wrote
    assert run_lock.run_state(str(killed))["state"] == "crashed"
    shown = subprocess.run([sys.executable, "-m", "rn50kit.reliability.run_lock", str(killed)], cwd=ROOT, capture_output=True,
                           text=True, timeout=HANG_S)
    assert '"state": "crashed"' in shown.stdout


@pytest.mark.slow
def test_runner_exits_130_on_ctrl_c_after_the_workers_saved(tmp_path):
    import signal
    import subprocess
    import sys
    from conftest import HANG_S, ROOT, TINY_RUN, venv_env, wait_until
    workspace = tmp_path / "ws"
    out, err = open(tmp_path / "run.out", "w"), open(tmp_path / "run.err", "w")
    process = subprocess.Popen([sys.executable, os.path.join(ROOT, "runner"), "-n", "1", "-b", "8", "-e", "2",
                                *TINY_RUN, "--num-examples", "100000", "--warmup-epochs", "0", "--disp-batches", "1",
                                "--workspace", str(workspace)], env=venv_env(), stdout=out, stderr=err, text=True,
                               start_new_session=True)
    try:
        wait_until(lambda: steps_logged(workspace) >= 2, "two training steps", process=process)
        process.send_signal(signal.SIGINT)  # runner alone: what a terminal's Ctrl-C sends it
        status = process.wait(timeout=HANG_S)
    finally:
        if process.poll() is None:
            process.kill()
    err = (tmp_path / "run.err").read_text()
    assert status == 130, err[-3000:]
    assert "runner: stopped by Ctrl-C after saving a checkpoint" in err and "Traceback" not in err
    assert list(workspace.glob("model-0000-step*.state.json"))


# --- item 5: refusals in one line, the same from runner and train.py ---------------------------------------------

def train_refusal(*argv):
    from conftest import TINY_RUN
    args = train.parse_args(["--kv-store", "local", *TINY_RUN, *argv])
    with pytest.raises(cli.UsageError) as error:
        train.main(args)
    return str(error.value)


def runner_refusal(*argv, gpus=0):
    from rn50kit.launch import launcher
    with pytest.raises(cli.UsageError) as error:
        launcher.plan_launch(["--data-backend", "synthetic", "--dtype", "float32", *argv], launcher.Machine(gpus, 2), {})
    return str(error.value)


@pytest.mark.parametrize("argv, expected", [
    (["--dtype", "float16"], "--dtype float16 needs a GPU and this machine has none"),
    (["--conv-layout", "NHWC"], "--conv-layout NHWC needs a GPU (cuDNN) and this machine has none"),
    (["--gpus", "0,1", "--kv-store", "device"], "--gpus 0,1 names GPUs and this machine has none"),
])
def test_what_a_cpu_cannot_run_is_refused_alike_by_runner_and_train(argv, expected):
    import mxnet as mx
    assert mx.context.num_gpus() == 0  # about a CPU machine
    by_train = train_refusal(*[a for a in argv if a != "float32"])
    assert by_train.startswith(expected) and "\n" not in by_train
    assert runner_refusal(*argv) == by_train
    runner_refusal_on_gpus = None
    try:
        from rn50kit.launch import launcher
        workers = ["-n", "2"] if "--gpus" in argv else []  # -n agrees with --gpus (devices.select_gpus)
        launcher.plan_launch(["--data-backend", "synthetic", *workers, *argv], launcher.Machine(8, 64), {})
    except cli.UsageError as error:
        runner_refusal_on_gpus = str(error)
    assert runner_refusal_on_gpus is None  # each runs on GPUs


def test_a_negative_lr_is_refused():
    assert train_refusal("--lr", "-1") == "--lr must not be negative, got -1"
    assert runner_refusal("-l", "-1") == "-l must not be negative, got -1.0"


@pytest.mark.slow
def test_ctrl_c_in_benchmark_is_one_line_and_leaves_no_partial_run(tmp_path):
    import signal
    import subprocess
    import sys
    from conftest import HANG_S, ROOT, TINY_RUN, venv_env, wait_until
    out = tmp_path / "sweep.json"
    err = open(tmp_path / "sweep.err", "w")
    sweep = subprocess.Popen([sys.executable, os.path.join(ROOT, "benchmark.py"), "-n", "1", "-b", "8", "-i", "100000",
                              "--mode", "train", "-o", str(out), *TINY_RUN, "--disp-batches", "1"], env=venv_env(),
                             stdout=subprocess.DEVNULL, stderr=err, text=True)
    try:
        wait_until(lambda: any(steps_logged(log.parent) >= 2 for log in tmp_path.glob("benchmark-*/run-*/log.jsonl")),
                   "the sweep's run to train two steps", process=sweep)
        sweep.send_signal(signal.SIGINT)  # what Ctrl-C sends benchmark.py (its runs have their own session)
        status = sweep.wait(timeout=HANG_S)
    finally:
        if sweep.poll() is None:
            sweep.kill()
    text = (tmp_path / "sweep.err").read_text()
    assert status == 130, text[-3000:]
    assert text.strip().splitlines()[-1] == "benchmark: interrupted during n=1 bs=8"
    assert "rerun the same command" not in text and "Traceback" not in text
    assert not list(tmp_path.glob("sweep-*.json"))  # no partial per-run report


# --- item 6: a dry run refuses what the run would ----------------------------------------------------------------

def run_command(*command, env=None):
    import subprocess
    import sys
    from conftest import HANG_S, ROOT, venv_env
    environ = {k: v for k, v in venv_env().items() if not k.startswith("SLURM_")}
    environ.update(env or {})
    return subprocess.run([sys.executable, os.path.join(ROOT, command[0]), *command[1:]], env=environ,
                          capture_output=True, text=True, timeout=HANG_S, stdin=subprocess.DEVNULL)


@pytest.mark.slow
def test_runner_dry_run_refuses_a_typo_and_a_bad_value_as_the_run_does():
    typo = run_command("runner", "--dry-run", "--data-backend", "synthetic", "--lr-schedual", "step")
    assert typo.returncode == 2 and typo.stdout == "", typo.stdout
    assert typo.stderr.strip().splitlines()[-1].startswith("train.py: error: unrecognized arguments: --lr-schedual")
    steps = run_command("runner", "--dry-run", "--data-backend", "synthetic", "-e", "10", "--lr-schedule", "step",
                        "--lr-steps", "5,20")
    assert steps.returncode == 2 and "--lr-steps [20.0] lie at or beyond the last epoch (10)" in steps.stderr
    fine = run_command("runner", "--dry-run", "--data-backend", "synthetic", "-e", "30", "--lr-schedule", "step",
                       "--lr-steps", "5,20")
    assert fine.returncode == 0 and "--lr-steps 5,20" in fine.stdout, fine.stderr


@pytest.mark.slow
def test_runner_dry_run_with_slurm_outside_srun_is_refused():
    result = run_command("runner", "--dry-run", "--launcher", "slurm", "--data-backend", "synthetic")
    assert result.returncode == 2 and result.stdout == ""
    # (without Horovod's MPI the refusal names that first: either way, not the command)
    assert "srun" in result.stderr or "MPI" in result.stderr


@pytest.mark.slow
def test_benchmark_dry_run_names_what_the_machine_would_refuse():
    import mxnet as mx
    assert mx.context.num_gpus() == 0
    result = run_command("benchmark.py", "--dry-run", "-n", "1", "-b", "8,16", "--dtype", "float16",
                         "--data-backend", "synthetic")
    assert result.returncode == 1 and result.stdout == ""
    assert "benchmark: would skip n=1 bs=8: runner: error: --dtype float16 needs a GPU" in result.stderr


# --- item 9: a recipe's LR steps follow the run's length unless typed -------------------------------------------

def notes_lr(recipe):
    """fill_hyper_parameters' note on the recipe's LR for the default batch (no --lr typed)."""
    return schedules.recipe_lr_source(recipe, 192)[1]


@pytest.mark.parametrize("recipe", ["he", "nvidia-2019"])
def test_a_recipes_steps_are_scaled_to_a_shorter_run_unless_typed(recipe):
    from rn50kit.config import settings
    argv = ["--recipe", recipe, "--num-epochs", "30"]
    args = train.parse_args(argv)
    note = " ".join(train.fill_hyper_parameters(args, settings.given_flags(train.get_args_parser(), argv)))
    assert args.lr_steps == [10, 20, 26.67] and "scaled to this run's 30" in note
    train.check_config(train_config.from_args(args))  # no longer refused
    typed = argv + ["--lr-steps", "30,60,80"]
    args = train.parse_args(typed)
    assert train.fill_hyper_parameters(args, settings.given_flags(train.get_args_parser(), typed)) == [notes_lr(recipe)]
    with pytest.raises(cli.UsageError, match="lie at or beyond the last epoch"):  # typed: the user's, refused
        train.check_config(train_config.from_args(args))
    args = train.parse_args(["--recipe", recipe])  # the recipe's own length: its own steps
    assert train.fill_hyper_parameters(args) == [notes_lr(recipe)] and args.lr_steps == [30, 60, 80]


# --- item 7: a score per dtype and calibration ---------------------------------------------------------------

def test_float32_and_int8_scores_of_a_checkpoint_do_not_overwrite_each_other(tmp_path):
    from rn50kit.config import settings
    from test_settings import fake_checkpoint, parse
    params = fake_checkpoint(tmp_path, 2, num_classes=10, image_shape=[3, 32, 32])
    reports = set()
    for flags in ([], ["--dtype", "int8"], ["--dtype", "int8", "--calib-mode", "entropy"]):
        args, given = parse("--mode", "val", "--data-backend", "synthetic", "--workspace", tmp_path, *flags)
        settings.complete(args, given, num_gpus=0)
        reports.add(os.path.basename(args.report))
    assert reports == {"model-0002.float32.score.json", "model-0002.int8-naive-10.score.json",
                       "model-0002.int8-entropy-10.score.json"}


# --- item 8: the benchmark says which network and input, and warns about a baseline of another kind ------------

def test_a_baseline_of_another_network_or_mode_is_warned_about():
    import benchmark
    cell = {"train.total_ips": 10.0}
    result = {"model": "resnet50_v1.5", "image_shape": "3,224,224", "mode": "train", "dtype": "bfloat16",
              "metrics": {"1": {"16": cell}}}
    same = {"model": "resnet50_v1.5", "image_shape": "3,224,224", "mode": "train", "dtype": "float32",
            "metrics": {"1": {"16": {"train.total_ips": 5.0}}}}
    assert benchmark.baseline_problems(result, same) == []  # another dtype is what a baseline is for
    other = dict(same, model="resnet18_v1.5", image_shape="3,32,32", mode="val")
    problems = benchmark.baseline_problems(result, other)
    assert problems == ["the baseline's network is resnet18_v1.5, this sweep's resnet50_v1.5",
                        "the baseline's image shape is 3,32,32, this sweep's 3,224,224",
                        "the baseline's mode is val, this sweep's train"]
    disjoint = dict(same, metrics={"2": {"64": {"train.total_ips": 5.0}}})
    assert "none of this sweep's worker counts and batch sizes" in benchmark.baseline_problems(result, disjoint)[0]
    assert benchmark.model_title(result) == "resnet50_v1.5, 3x224x224"


# --- item 11: messages that say which case it is --------------------------------------------------------------

def test_a_bad_resume_says_which_case_what_exists_and_what_is_accepted(tmp_path):
    from rn50kit.training import checkpoint
    from test_settings import fake_checkpoint, touch
    fake_checkpoint(tmp_path, 2)
    touch(tmp_path / "model-best.params")
    touch(tmp_path / "model-0001.params")  # no state file beside it
    accepted = "give --resume auto (the latest), none (start afresh) or a <prefix>-NNNN.params"
    cases = {"model-0009.params": "no such file",
             "model-best.params": "a -best or -ema copy holds weights only",
             "model-0001.params": "no model-0001.state.json beside it"}
    for name, case in cases.items():
        message = checkpoint.why_not_resumable(str(tmp_path / name))
        assert f": {case}" in message and f"complete checkpoints in {tmp_path}: model-0002.params" in message
        assert accepted in message and "\n" not in message
    (tmp_path / "model-0002.states").unlink()
    message = checkpoint.why_not_resumable(str(tmp_path / "model-0002.params"))
    assert "its files model-0002.states are missing" in message and f"no complete checkpoint in {tmp_path}" in message


def test_a_data_root_naming_the_rec_file_says_give_its_folder(tmp_path):
    from rn50kit.config import settings
    rec = tmp_path / "train.rec"
    rec.write_bytes(b"x")
    expected = f"--data-root {rec} is a file; give the folder that holds train.rec and val.rec (--data-root {tmp_path})"
    args = train.parse_args(["--data-root", str(rec)])
    with pytest.raises(ValueError) as error:
        settings.complete(args, {"data_root"}, num_gpus=0)
    assert str(error.value).startswith(expected)
    assert runner_refusal("--data-backend", "dali-cpu", "--data-root", str(rec)).startswith(expected)


def test_scoring_without_a_checkpoint_is_refused_before_any_scoring_line(tmp_path, caplog):
    files = labelled_records(tmp_path, [i % 10 for i in range(20)])
    args = train.parse_args(["--kv-store", "local", "--mode", "val", "--data-backend", "dali-cpu", "--num-layers",
                             "18", "--num-classes", "10", "--image-shape", "3,32,32", "--data-val", files["val"][0],
                             "--workspace", str(tmp_path / "empty")])
    with caplog.at_level("INFO"), pytest.raises(cli.UsageError, match="no checkpoint to score: give --load"):
        train.main(args)
    assert "Scoring" not in caplog.text


@pytest.mark.slow  # a heavier in-process test (the fast lane stays under a minute)
def test_a_batch_larger_than_the_data_and_class_names_of_the_wrong_length_are_warned_about(tmp_path, caplog):
    import mxnet as mx
    from rn50kit.scoring import predict
    files = labelled_records(tmp_path, [i % 10 for i in range(20)])
    with caplog.at_level("WARNING"):
        train.warn_about(record_config(files, "dali-cpu", 10).replace(fit__batch_size=32), primary=True)
    assert "--batch-size 32 (global) is larger than the 20 training records" in caplog.text
    caplog.clear()
    net = mx.gluon.nn.Dense(4)
    net.initialize()
    with caplog.at_level("WARNING"):
        predict.predict(net, np.ones((1, 3), "float32"), mx.cpu(), "float32", names=["a", "b", "c", "d"])
        assert "class names" not in caplog.text
        predict.predict(net, np.ones((1, 3), "float32"), mx.cpu(), "float32", names=["a", "b", "c"])
    assert "3 class names (--class-names, or the .lst beside --data-train) for a network of 4 classes" in caplog.text


def test_resuming_with_other_settings_is_noted():
    import fit
    saved = {"batch_size": 32, "image_shape": [3, 32, 32], "num_epochs": 16, "lr": 0.4, "dtype": "float32"}
    assert fit.changed_on_resume(saved, dict(saved)) == ""
    now = dict(saved, batch_size=64, image_shape=[3, 64, 64], num_epochs=30)
    assert fit.changed_on_resume(saved, now) == \
        "--batch-size 64 (was 32), --image-shape 3,64,64 (was 3,32,32), --num-epochs 30 (was 16)"


# --- item 12: smaller ones ---------------------------------------------------------------------------------

def test_report_py_says_a_benchmark_json_is_not_a_run_report_and_which_iterations_its_speed_covers(tmp_path,
                                                                                                  monkeypatch, capsys):
    import json
    from rn50kit.reporting import report
    sweep = tmp_path / "sweep.json"
    sweep.write_text(json.dumps({"model": "resnet18_v1.5", "ngpus": [1], "bs": [8], "metric_keys": ["x"],
                                 "metrics": {}}))
    monkeypatch.setattr("sys.argv", ["report.py", str(sweep)])
    with pytest.raises(SystemExit) as end:
        report.main()
    assert "is a benchmark.py result (a sweep), not a run's report" in str(end.value)
    run = report.Report("resnet18_v1.5", 1, ["train.py"])
    run.add_epoch("train", durations=[0.1] * 23, batch_size=8, loss=1.0)
    assert "the last epoch's 3 timed iteration(s): its first 20 are left out" in run.summary()


def test_the_first_line_says_global_batch_and_per_worker():
    cfg = train_config.RunConfig().replace(fit__batch_size=64, fit__num_epochs=2, fit__lr=0.1, fit__workspace="ws",
                                     data__data_backend="synthetic", fit__dtype="float32")
    assert "2 worker(s), global batch 64 (32 per worker), float32" in train.header(cfg, 2, "report.json")
    assert "1 worker(s), global batch 64, float32" in train.header(cfg, 1, "report.json")


@pytest.mark.slow
@pytest.mark.parametrize("tool", ["check_dataset.py", "plot_report.py"])
def test_the_tools_hand_over_to_the_kits_python_as_runner_does(tmp_path, tool):
    import json
    import shutil
    import subprocess
    import sys
    from conftest import HANG_S, ROOT
    bare = shutil.which("python3") or pytest.skip("no system python3")
    if tool == "check_dataset.py":
        files = labelled_records(tmp_path, [i % 10 for i in range(20)])
        argv = [files["train"][0], "--num-classes", "10", "--jobs", "1"]
    else:
        report = tmp_path / "report.json"
        report.write_text(json.dumps({"metrics": {"train.loss": [2.0, 1.0], "val.top1": [0.5, 0.7]}}))
        argv = [str(report)]
    env = {"PATH": os.environ["PATH"], "RN50_PYTHON": sys.executable, "HOME": os.environ.get("HOME", "/tmp")}
    # -S: a Python without the kit's packages (no site-packages at all)
    result = subprocess.run([bare, "-S", os.path.join(ROOT, "tools", tool), *argv], env=env, capture_output=True,
                            text=True, timeout=HANG_S)
    assert result.returncode == 0 and "ModuleNotFoundError" not in result.stderr, result.stderr[-2000:]


@pytest.mark.slow  # a heavier in-process test (the fast lane stays under a minute)
def test_export_onnx_exports_model_best(tmp_path):
    pytest.importorskip("onnx")
    pytest.importorskip("onnxruntime")
    import shutil
    import sys
    from conftest import ROOT
    sys.path.insert(0, os.path.join(ROOT, "tools"))
    import export_onnx
    import models
    net = built(18, 32)
    import mxnet as mx
    net(mx.nd.zeros((1, 3, 32, 32)))
    prefix = str(tmp_path / "model")
    models.export(net, prefix, 1)
    shutil.copyfile(f"{prefix}-0001.params", f"{prefix}-best.params")
    onnx_file = export_onnx.export_onnx(prefix, "best", (3, 32, 32))
    assert onnx_file == f"{prefix}-best.onnx"
    assert export_onnx.compare_with_onnxruntime(prefix, "best", onnx_file, (3, 32, 32)) < 1e-4


def test_the_progress_line_says_which_epoch_of_how_many_and_that_its_eta_is_the_runs(caplog):
    import io
    from rn50kit.reporting.progress import Progress
    with caplog.at_level("INFO", logger="rn50"):
        Progress(True, 1, stream=io.StringIO(), num_epochs=16).update(8, 3, 10, 12.5, 1.25, 0.1, 3725)
    assert "Epoch[8/16] Batch[3/10] 12.5 img/s loss 1.2500 lr 0.10000 run ETA 1:02:05" in caplog.text


def test_the_int8_calibration_line_agrees_with_itself_and_shows_a_date(tmp_path):
    from rn50kit.scoring import quantize
    rec = tmp_path / "train.rec"
    rec.write_bytes(b"x" * 10)
    source = quantize.calibration_source("dali-cpu", str(rec))
    assert " UTC)" in source and "modified 20" in source
    calibration = dict(quantize.describe_calibration("naive", 10, 64, source), records=160, graph="g")
    line = quantize.summary(calibration)
    assert "on 160 training records (fewer than the 10 batches of 64 asked for: the data has 160)" in line
    assert "on 640 training records (10 batches of 64)" in quantize.summary(dict(calibration, records=640))
