"""train.py's and runner's flags for the tests' small runs, runner's plan for a described machine, the refusals
both give, and what a run leaves in its workspace (log.jsonl, report.json). train.py is imported where used: a
test file that only builds command lines collects without MXNet."""
import json
import os
import sys

import pytest

from rn50kit.launch.machine import Machine
from rn50kit.launch.plan import plan_launch
from rn50kit.training.configure import configure

from .processes import ROOT

# A tiny ResNet on synthetic data: the flags every quick end-to-end run of the tests shares.
TINY_RUN = ["--data-backend", "synthetic", "--dtype", "float32", "--num-layers", "18", "--image-shape", "3,32,32",
            "--num-classes", "10"]


def digits_run(digits):
    """train.py's flags for a tiny ResNet-18 on the digits dataset (``digits``: its folder, from the digits_data
    fixture): both record files, the DALI CPU backend on one thread, 32-pixel images, light augmentation."""
    d = str(digits)
    return ["--data-backend", "dali-cpu", "--dali-threads", "1", "--dali-validation-threads", "1",
            "--data-train", f"{d}/train.rec", "--data-train-idx", f"{d}/train.idx",
            "--data-val", f"{d}/val.rec", "--data-val-idx", f"{d}/val.idx",
            "--num-layers", "18", "--num-classes", "10", "--image-shape", "3,32,32", "--data-val-resize", "32",
            "--random-mirror", "0", "--min-random-area", "0.5"]


def digits_runner(digits, workspace, workers, per_worker, epochs, examples, *extra):
    """runner's command for ``workers`` Horovod workers training a tiny ResNet-18 on the digits (--data-root) from
    seed 3, for ``epochs`` epochs of ``examples`` images, a log line every step; ``extra`` flags last."""
    return [sys.executable, os.path.join(ROOT, "runner"), "-n", str(workers), "-b", str(per_worker),
            "-e", str(epochs), "-l", "0.4", "--dtype", "float32", "--data-backend", "dali-cpu", "--data-root",
            str(digits), "--dali-threads", "1", "--dali-validation-threads", "1", "--num-layers", "18",
            "--num-classes", "10", "--image-shape", "3,32,32", "--data-val-resize", "32",
            "--num-examples", str(examples), "--random-mirror", "0", "--seed", "3", "--disp-batches", "1",
            "--workspace", str(workspace), *extra]


def value_after(command, flag):
    """The word after the last ``flag`` in ``command`` (the one that counts)."""
    return command[len(command) - 1 - command[::-1].index(flag) + 1]


def configured(argv):
    """The RunConfig train.py builds from ``argv`` (a CPU run), in this process and without MXNet."""
    from rn50kit.config import train_flags
    return configure(train_flags.parse_args(argv), train_flags.given_flags(argv), 0)


def parse_train(*argv):
    import train
    return train.parse_args([str(a) for a in argv])


GLOBAL_BATCH = 16  # 2 ranks x 8: each shard of datasets.sorted_records' 32 records is exactly 4 batches


def parse_ordered(rec, idx, *extra):
    """train.py's flags reading datasets.sorted_records through DALI, GLOBAL_BATCH images a step."""
    import train
    return train.parse_args(
        ["--data-backend", "dali-cpu", "--data-train", rec, "--data-train-idx", idx, "--batch-size",
         str(GLOBAL_BATCH), "--image-shape", "3,16,16", "--dali-threads", "1", *extra])


def record_config(files, backend, num_classes):
    """A RunConfig reading ``files`` (datasets.labelled_records') through ``backend``, one epoch."""
    from rn50kit.config import train_config
    return train_config.RunConfig().replace(
        data__data_backend=backend, data__data_train=files["train"][0], data__data_train_idx=files["train"][1],
        data__data_val=files["val"][0], data__data_val_idx=files["val"][1], model__num_classes=num_classes,
        fit__num_epochs=1, fit__warmup_epochs=0)


def train_refusal(*argv):
    """train.main's one-line refusal of TINY_RUN with ``argv``."""
    import train
    from rn50kit.config import cli
    args = train.parse_args(["--kv-store", "local", *TINY_RUN, *argv])
    with pytest.raises(cli.UsageError) as error:
        train.main(args)
    return str(error.value)


# --- runner's plan for a described machine (unit/test_launcher, test_devices, test_benchmark, test_gpu_check) -----

EIGHT_GPU_MACHINE = Machine(8, 64)


def planned_train_argv(argv, machine=EIGHT_GPU_MACHINE, environ=None):
    """runner's plan for ``argv`` on ``machine``: (the workers' environment, train.py's flags)."""
    _, env, command = plan_launch([str(a) for a in argv], machine, environ or {})
    start = next(i for i, word in enumerate(command) if word.endswith("train.py")) + 1
    return env, command[start:]


def plan_refusal(*argv, gpus=0):
    """runner's one-line refusal to plan ``argv`` on a machine of ``gpus`` GPUs and 2 cores."""
    from rn50kit.config import cli
    with pytest.raises(cli.UsageError) as error:
        plan_launch(["--data-backend", "synthetic", "--dtype", "float32", *argv], Machine(gpus, 2), {})
    return str(error.value)


# --- tools/gpu_check.py's checks (unit/test_gpu_check, e2e/test_self_check) ---------------------------------------

CPU_CHECKS = {"versions", "horovod-build", "numerics-cpu", "training-cpu", "data-cpu", "allreduce-cpu"}
GPU_CHECKS = {"driver", "kernels", "numerics-gpu", "training-gpu", "data-gpu", "allreduce-gpu", "layout-speed",
              "memory", "fused-batchnorm"}


# --- what a run leaves in its workspace ----------------------------------------------------------------------------

def steps_logged(workspace):
    """How many training steps the run in ``workspace`` has logged (0 before its log.jsonl exists)."""
    log = workspace / "log.jsonl"
    return sum(1 for line in open(log) if '"type": "iter"' in line) if log.exists() else 0


def logged(workspace, kind):
    """The records of ``kind`` ("iter", "epoch", ...) in the workspace's log.jsonl."""
    return [json.loads(line) for line in open(workspace / "log.jsonl") if f'"type": "{kind}"' in line]


def metrics(workspace):
    """report.json's metrics: {name: a value per epoch}."""
    with open(os.path.join(workspace, "report.json")) as f:
        return json.load(f)["metrics"]
