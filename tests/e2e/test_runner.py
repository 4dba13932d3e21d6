"""runner's answers to bad input, in real processes: one line, non-zero exit, no traceback; its dry run refuses
what the run would."""
import os
import shlex
import shutil
import subprocess
import sys

import numpy as np
import pytest

from support.datasets import write_record_file
from support.processes import HANG_S, ROOT, alone_env, mxnet_openmp_threads, physical_cores, run_command, venv_env
from support.runs import value_after

pytestmark = pytest.mark.slow  # launches processes or trains end to end


def run_runner(*args):
    return subprocess.run([sys.executable, os.path.join(ROOT, "runner"), *args], env=venv_env(),
                          capture_output=True, text=True, timeout=HANG_S)


def test_missing_data_root_is_one_clear_line(tmp_path):
    result = run_runner("-n", "1", "--data-root", str(tmp_path / "nowhere"))
    assert result.returncode != 0
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "does not exist" in lines[0] and "prepare_imagenet.sh" in lines[0] and "make demo" in lines[0]


def test_data_root_without_train_rec(tmp_path):
    (tmp_path / "val.rec").write_bytes(b"")
    result = run_runner("-n", "1", "--data-root", str(tmp_path))
    assert result.returncode != 0
    assert "Traceback" not in result.stderr
    assert "train.rec" in result.stderr and len(result.stderr.strip().splitlines()) == 1


# --- the command line runner builds, checked with --dry-run (nothing is launched) ---

def dry_run(*args):
    result = run_runner(*args, "--dry-run")
    assert result.returncode == 0, result.stderr
    *env_lines, command = result.stdout.strip().splitlines()
    env = dict(line.split("=", 1) for line in env_lines)
    return env, command.split()


def has_gpu():
    return os.path.isdir("/proc/driver/nvidia/gpus")


def test_batch_and_lr_scaling_and_horovodrun_prefix():
    env, command = dry_run("-n", "2", "-b", "32", "-l", "0.5", "--data-backend", "synthetic", "--dtype", "float32")
    assert os.path.basename(command[0]) == "horovodrun"
    assert command[1:6] == ["-np", "2", "-H", "localhost:2", "--gloo"]
    assert command[7].endswith("train.py")
    assert value_after(command, "--batch-size") == "64"
    assert abs(float(value_after(command, "--lr")) - 0.5 * 64 / 256) < 1e-12
    assert "--num-epochs" not in command  # train.py takes the recipe's (or 1 scoring pass)
    assert env["HOROVOD_FUSION_THRESHOLD"] == "67108864"
    assert "MXNET_USE_TENSORRT" not in env and "MXNET_HOROVOD_NUM_GROUPS" not in env  # not read upstream
    assert "MXNET_UPDATE_ON_KVSTORE" not in env  # gluon.Trainer ignores it: our trainers pass update_on_kvstore


def test_unknown_flags_pass_through_after_runner_flags():
    # (train.py's flags, checked by its parser before a dry run too: an unknown one is refused, see
    # test_runner_dry_run_refuses_a_typo_and_a_bad_value_as_the_run_does)
    _, command = dry_run("-n", "1", "--data-backend", "synthetic", "--dtype", "float32", "--num-layers", "18",
                         "--disp-batches", "7", "-e", "3")
    assert command[-4:] == ["--num-layers", "18", "--disp-batches", "7"]
    assert value_after(command, "--num-epochs") == "3"


def test_multi_node_host_list_and_hostfile(tmp_path):
    _, command = dry_run("-n", "16", "-b", "8", "-H", "node1:8,node2:8", "--data-backend", "synthetic",
                         "--dtype", "float32")
    assert command[1:6] == ["-np", "16", "-H", "node1:8,node2:8", "--gloo"]
    assert value_after(command, "--batch-size") == "128"
    hostfile = tmp_path / "hosts"
    hostfile.write_text("node1 slots=4\nnode2 slots=4\n")
    _, command = dry_run("-n", "8", "--hostfile", str(hostfile), "--data-backend", "synthetic", "--dtype", "float32")
    assert command[1:6] == ["-np", "8", "--hostfile", str(hostfile), "--gloo"]
    result = run_runner("-n", "9", "--hostfile", str(hostfile), "--data-backend", "synthetic", "--dry-run")
    assert result.returncode != 0 and "8 slots" in result.stderr


def test_val_mode_needs_only_val_data(tmp_path):
    # real records: the dry run checks the data as the run would
    images = [np.full((8, 8, 3), 40 * i, "uint8") for i in range(4)]
    write_record_file(str(tmp_path / "val"), images, [0, 1, 0, 1])
    _, command = dry_run("-n", "1", "--data-root", str(tmp_path), "--mode", "val", "--dtype", "float32",
                         "--data-backend", "dali-cpu")
    assert "--data-train" not in command
    assert value_after(command, "--data-val") == str(tmp_path / "val.rec")
    assert value_after(command, "--mode") == "val"


def one_line_error(result, *words):
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    for word in words:
        assert word in lines[0], lines[0]


@pytest.mark.skipif(has_gpu(), reason="a GPU machine accepts float16")
def test_float16_on_cpu_refused_at_once_without_mxnet():
    env = venv_env()
    env["PYTHONPROFILEIMPORTTIME"] = "1"  # lists every module imported: MXNet must not be among them
    result = subprocess.run([sys.executable, os.path.join(ROOT, "runner"), "-n", "1", "-b", "208", "--dtype",
                             "float16"], env=env, capture_output=True, text=True, timeout=HANG_S)
    assert result.returncode == 2
    imported = {line.rsplit("|", 1)[1].strip() for line in result.stderr.splitlines()
                if line.startswith("import time:") and "|" in line}
    assert imported, "no import list: PYTHONPROFILEIMPORTTIME was not honoured"
    # the packages, by top-level name (the kit's own launch modules are named after horovodrun and may load)
    assert not {name for name in imported if name.split(".")[0] in ("mxnet", "horovod")}
    errors = [line for line in result.stderr.splitlines() if not line.startswith("import time:")]
    assert len(errors) == 1 and errors[0].startswith("runner: error:")
    assert "float16" in errors[0] and "float32" in errors[0] and "bfloat16" in errors[0]


@pytest.mark.skipif(has_gpu(), reason="the CPU defaults apply without a GPU")
def test_cpu_defaults_and_too_many_workers():
    _, command = dry_run("-n", "1", "--data-backend", "synthetic")
    assert value_after(command, "--dtype") == "float32"
    cores = len(os.sched_getaffinity(0))
    one_line_error(run_runner("-n", str(cores + 1), "--data-backend", "synthetic"), f"-n {cores + 1}", "CPU cores")
    one_line_error(run_runner("--data-backend", "dali-gpu", "--dtype", "float32"), "dali-cpu")
    env = venv_env()
    env.pop("OMP_NUM_THREADS")  # a value already set wins; without one, runner shares the cores out
    result = subprocess.run([sys.executable, os.path.join(ROOT, "runner"), "-n", "1", "--data-backend",
                             "synthetic", "--dry-run"], env=env, capture_output=True, text=True, timeout=HANG_S)
    assert f"OMP_NUM_THREADS={cores}" in result.stdout.splitlines()


# train.py as a script up to its --help (it has imported MXNet by then)
TRAIN_PY_START = """import runpy, sys
sys.argv = [TRAIN_PY, "--help"]
try:
    runpy.run_path(TRAIN_PY, run_name="__main__")
except SystemExit:
    pass"""


def test_train_py_alone_gives_mxnet_a_thread_per_core():
    """MXNet 1.9 without OMP_NUM_THREADS takes half of the logical CPUs on x86 (it assumes hyper-threads);
    train.py started alone on a CPU machine (`python train.py --mode val ...`) sets one thread per physical core.
    Under a launcher it leaves MXNet's choice (runner sets each worker's share; see above)."""
    from rn50kit.hardware import devices
    cores, logical = physical_cores(), len(os.sched_getaffinity(0))
    if logical < 2 or cores < 2:
        pytest.skip("one core: half of the cores is the same core")
    env = dict(alone_env(), PYTHONPATH=ROOT)
    start = TRAIN_PY_START.replace("TRAIN_PY", repr(os.path.join(ROOT, "train.py")))

    def threads(**extra):
        return mxnet_openmp_threads(dict(env, **extra), start)
    assert threads() == (logical // 2 if devices.nvidia_gpu_present() else cores)
    assert threads(HOROVOD_SIZE="1", HOROVOD_RANK="0") == logical // 2  # a launcher's worker: MXNet's own choice


def test_bad_numbers_are_one_line():
    one_line_error(run_runner("-n", "0"), "-n (--ngpus) must be at least 1")
    one_line_error(run_runner("-b", "0", "--data-backend", "synthetic"), "-b must be at least 1")


def test_a_missing_data_file_given_by_name_is_refused_before_launching(tmp_path):
    # A data file given one by one: runner's check of train.py's flags looks at it too (issue 58), once.
    missing = tmp_path / "missing.rec"
    result = run_runner("-n", "2", "-b", "2", "-e", "1", "--data-backend", "dali-cpu", "--dtype", "float32",
                        "--data-train", str(missing), "--data-train-idx", str(missing), "--workspace", str(tmp_path))
    assert result.returncode == 2, result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"train.py: error: --data-train {missing} does not exist"), lines


@pytest.mark.skipif(not shutil.which("ssh"), reason="no ssh client (apt-get install openssh-client); CI has one")
def test_a_host_ssh_cannot_reach_is_one_runner_line(tmp_path):
    # horovodrun checks every remote host over ssh before starting any worker, and raises when one fails.
    result = run_runner("-n", "2", "-H", "nosuchhost.invalid:1,localhost:1", "-b", "2", "-e", "1",
                        "--data-backend", "synthetic", "--workspace", str(tmp_path))
    assert result.returncode == 1, result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    assert "ssh not successful for host nosuchhost.invalid" in result.stdout  # horovodrun names the host
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("runner: error: horovodrun: could not connect to some hosts via ssh") and "ssh HOST" in last


def test_a_refusal_every_worker_reaches_is_its_one_line_without_horovods_noise(tmp_path):
    # ResNet-50 at 4096 images per worker needs about 488 GiB. runner refuses it before launching (issue 58); under
    # horovodrun itself every worker's memory check refuses it together (as where runner cannot estimate: GPUs,
    # other hosts).
    flags = ["--batch-size", "8192", "--num-epochs", "1", "--data-backend", "synthetic", "--dtype", "float32",
             "--mode", "train", "--workspace", str(tmp_path)]
    result = run_runner("-n", "2", "-b", "4096", *flags[2:])
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-3000:]
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("train.py: error: training needs about"), lines
    assert "runner's -b" in lines[0]
    result = subprocess.run(["horovodrun", "-np", "2", "-H", "localhost:2", "--gloo", sys.executable,
                             os.path.join(ROOT, "train.py"), *flags], env=venv_env(), capture_output=True, text=True,
                            timeout=HANG_S)
    output = result.stdout + result.stderr
    assert result.returncode != 0, output[-3000:]
    assert output.count("train.py: error: training needs about") == 1, output[-3000:]
    # A worker that leaves while a peer's Horovod loop still runs makes that peer print a C++ error line.
    assert "uncaught exception" not in output and "Connection reset" not in output, output[-3000:]


@pytest.mark.slow
def test_runner_dry_run_refuses_a_typo_and_a_bad_value_as_the_run_does():
    """Found by the second newcomer walk (issue 26)."""
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
    """Found by the second newcomer walk (issue 26)."""
    result = run_command("runner", "--dry-run", "--launcher", "slurm", "--data-backend", "synthetic")
    assert result.returncode == 2 and result.stdout == ""
    # (without Horovod's MPI the refusal names that first: either way, not the command)
    assert "srun" in result.stderr or "MPI" in result.stderr


def test_a_dry_run_prints_a_plan_that_pastes_as_the_same_words(digits_data):
    """Issue 58: --dry-run printed the command unquoted, so a pasted elastic plan split its discovery command into
    words and ran something else. Shell-quoted (shlex.join), the printed line parses back to the planned words.
    (Elastic runs read records through DALI: synthetic data is refused.)"""
    result = run_runner("-n", "2", "--min-np", "1", "-H", "localhost:2", "--data-backend", "dali-cpu",
                        "--data-root", str(digits_data), "--dtype", "float32", "--dry-run")
    assert result.returncode == 0, result.stderr
    *env_lines, printed = result.stdout.strip().splitlines()
    words = shlex.split(printed)
    discovery = words[words.index("--host-discovery-script") + 1]
    assert discovery.endswith("discovery.py --hosts localhost:2") and " " in discovery  # one word, as planned
    assert words[words.index(discovery) + 1].startswith("--")  # nothing of it spilt into horovodrun's flags
    assert all(len(shlex.split(line)) == 1 for line in env_lines)  # KEY=value, pasted as one assignment
