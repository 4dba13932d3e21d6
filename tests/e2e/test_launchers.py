"""runner under real launchers: 2 workers under mpirun, under srun in a one-node Slurm, and on two "hosts" over
SSH (horovodrun's Gloo and mpirun). Each run is a tiny training (ResNet-18, 32 px digits, a few steps) through
runner's own code; a stand-in for train.py beside a copy of runner (tests/launch_worker.py) runs the kit's
train.main and records each worker's world and parameters.

The services come from tools/ci_services.sh (root): Open MPI, sshd on hostA/hostB (loopback), munge and Slurm.
Without them these tests skip, saying what is missing; with CI set they fail instead."""
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from rn50kit.reliability import world
from support.cluster import (
    TEST_HOSTS,
    horovod_has_mpi,
    loopback_address,
    mpirun_root_env,
    need_mpi,
    need_slurm,
    need_ssh_hosts,
    require,
)
from support.processes import HANG_S, ROOT, WORKERS, venv_env

pytestmark = pytest.mark.slow  # launches processes or trains end to end


# --- one tiny training per launcher ----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def kit(tmp_path_factory):
    """runner (an exact copy) beside the stand-in train.py: runner starts `python <its folder>/train.py`."""
    folder = tmp_path_factory.mktemp("kit")
    shutil.copy2(os.path.join(ROOT, "runner"), folder / "runner")
    shutil.copy2(os.path.join(WORKERS, "launch_worker.py"), folder / "train.py")
    return folder


def train(kit, digits_data, workspace, launch, runner_args):
    """2 workers, 8 images each per step, 4 steps, then the whole validation set."""
    command = [*launch, sys.executable, str(kit / "runner"), *runner_args, "-b", "8", "-e", "1", "-l", "0.4",
               "--data-root", str(digits_data), "--num-layers", "18", "--num-classes", "10",
               "--image-shape", "3,32,32", "--data-val-resize", "32", "--num-examples", "64", "--warmup-epochs", "0",
               "--dali-threads", "1", "--dali-validation-threads", "1", "--seed", "5", "--workspace", str(workspace)]
    env = venv_env()
    env.pop("OMP_NUM_THREADS")  # runner sets each worker's share
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=HANG_S, stdin=subprocess.DEVNULL)
    assert result.returncode == 0, (" ".join(command) + "\n" + result.stdout[-3000:] + result.stderr[-5000:])
    worlds = []
    for rank in range(2):
        with open(workspace / f"world-rank{rank}.json") as f:
            worlds.append(json.load(f))
    with open(workspace / "report.json") as f:
        report = json.load(f)
    return worlds, report


def check_one_training(workspace, worlds, report, digits_data):
    assert [w["rank"] for w in worlds] == [0, 1] and all(w["size"] == 2 for w in worlds), worlds
    rank0, rank1 = np.load(workspace / "params-rank0.npz"), np.load(workspace / "params-rank1.npz")
    assert sorted(rank0.files) == sorted(rank1.files)
    assert any(name.endswith("running_mean") for name in rank0.files)
    for name in rank0.files:
        np.testing.assert_array_equal(rank0[name], rank1[name], err_msg=name)
    with open(digits_data / "val.idx") as f:
        val_records = sum(1 for line in f if line.strip())
    assert report["ngpus"] == 2 and len(report["metrics"]["val.top1"]) == 1
    with open(workspace / "log.jsonl") as f:
        epochs = [record for record in map(json.loads, f) if record["type"] == "epoch"]
    assert [record["val.samples"] for record in epochs] == [val_records]  # every record once over both ranks


def test_mpirun_two_workers(kit, digits_data, tmp_path):
    need_mpi()
    worlds, report = train(kit, digits_data, tmp_path, [], ["--launcher", "mpi", "-n", "2"])
    check_one_training(tmp_path, worlds, report, digits_data)
    assert all(w["launcher"] == "mpirun" and w["mpi_enabled"] for w in worlds), worlds
    assert [w["local_rank"] for w in worlds] == [0, 1] and all(w["local_size"] == 2 for w in worlds), worlds
    assert all(w["omp_num_threads"] == str(max(1, len(os.sched_getaffinity(0)) // 2)) for w in worlds), worlds


def test_srun_two_tasks_in_one_node_slurm(kit, digits_data, tmp_path):
    need_slurm()
    # runner is started by srun, once per task, and takes the world's size (-n) from the step.
    worlds, report = train(kit, digits_data, tmp_path, ["srun", "-n", "2", "-t", "10"], ["--launcher", "slurm"])
    check_one_training(tmp_path, worlds, report, digits_data)
    assert all(w["launcher"] == "srun" and w["mpi_enabled"] for w in worlds), worlds
    assert [w["local_rank"] for w in worlds] == [0, 1] and all(w["local_size"] == 2 for w in worlds), worlds
    threads = max(1, len(os.sched_getaffinity(0)) // 2)  # task/none: both tasks share the node's cores
    assert all(w["omp_num_threads"] == str(threads) for w in worlds), worlds


def check_two_hosts(worlds):
    """One worker per host, each started through sshd on its host's own address."""
    assert all(w["local_rank"] == 0 and w["local_size"] == 1 for w in worlds), worlds
    assert [w["cross_rank"] for w in worlds] == [0, 1] and all(w["cross_size"] == 2 for w in worlds), worlds
    servers = [w["ssh_connection"] and w["ssh_connection"].split()[2] for w in worlds]
    assert servers == [loopback_address(host) for host in TEST_HOSTS], worlds


def test_horovodrun_gloo_over_ssh_on_two_hosts(kit, digits_data, tmp_path):
    need_ssh_hosts()
    worlds, report = train(kit, digits_data, tmp_path, [], ["-n", "2", "-H", "hostA:1,hostB:1"])
    check_one_training(tmp_path, worlds, report, digits_data)
    assert all(w["launcher"] == "horovodrun" and w["gloo_enabled"] and not w["mpi_enabled"] for w in worlds)
    check_two_hosts(worlds)
    # horovodrun found an interface both hosts reach and gave it to Gloo (and NCCL)
    interfaces = os.listdir("/sys/class/net")
    assert all(w["interfaces"]["HOROVOD_GLOO_IFACE"] in interfaces for w in worlds), worlds


def test_mpirun_over_ssh_on_two_hosts(kit, digits_data, tmp_path):
    need_mpi()
    need_ssh_hosts()
    worlds, report = train(kit, digits_data, tmp_path, [], ["--launcher", "mpi", "-n", "2", "-H", "hostA:1,hostB:1",
                                                            "--network-interface", "lo"])
    check_one_training(tmp_path, worlds, report, digits_data)
    assert all(w["launcher"] == "mpirun" and w["mpi_enabled"] for w in worlds), worlds
    check_two_hosts(worlds)
    # the chosen interface reached the remote workers: Open MPI's TCP transport and NCCL use only it
    assert all(w["interfaces"]["OMPI_MCA_btl_tcp_if_include"] == "lo" for w in worlds), worlds
    assert all(w["interfaces"]["NCCL_SOCKET_IFNAME"] == "lo" for w in worlds), worlds


def test_setup_check_names_what_this_machine_builds():
    """make setup's check: install_horovod.sh --features lists MPI exactly when mpicc is here (NCCL when MXNet is a
    CUDA build), and the installed Horovod has each feature listed."""
    import mxnet as mx
    features = subprocess.run([os.path.join(ROOT, "tools", "install_horovod.sh"), "--features", sys.executable],
                              capture_output=True, text=True, timeout=HANG_S, check=True).stdout.split()
    assert features[:2] == ["MXNet", "Gloo"]
    assert ("MPI" in features) == (shutil.which("mpicc") is not None)
    assert ("NCCL" in features) == mx.runtime.Features().is_enabled("CUDA")
    built = subprocess.run([os.path.join(os.path.dirname(sys.executable), "horovodrun"), "--check-build"],
                           capture_output=True, text=True, timeout=HANG_S, check=True).stdout
    for feature in features:
        assert f"[X] {feature}" in built, built


# --- a world that is not the launcher's stops at once --------------------------------------------------------

def test_workers_alone_under_mpirun_stop_with_one_line(tmp_path):
    """Horovod's Gloo controller and operations under mpirun give each worker a world of its own, as a Horovod
    without MPI does: train.py must stop before any work, with one line from the whole job."""
    need_mpi()
    command = ["mpirun", "-np", "2", "-x", "HOROVOD_CONTROLLER=gloo", "-x", "HOROVOD_CPU_OPERATIONS=gloo",
               "-x", "PYTHONPATH", "-x", "PATH",
               sys.executable, os.path.join(ROOT, "train.py"), "--data-backend", "synthetic", "--dtype", "float32",
               "--num-layers", "18", "--num-classes", "10", "--image-shape", "3,32,32", "--batch-size", "4",
               "--num-epochs", "1", "--workspace", str(tmp_path)]
    result = subprocess.run(command, env=mpirun_root_env(), capture_output=True, text=True, timeout=HANG_S)
    assert result.returncode != 0
    errors = [line for line in (result.stdout + result.stderr).splitlines() if "train.py: error:" in line]
    assert len(errors) == 1, result.stdout[-2000:] + result.stderr[-2000:]
    assert "mpirun started 2 workers" in errors[0] and "world of 1" in errors[0] and "unset it" in errors[0]
    assert "Traceback" not in result.stderr
    assert not list(tmp_path.glob("*.params")) and not (tmp_path / "report.json").exists()


def launcher_environments(launch):
    """The environment each of 2 workers gets from a real launcher."""
    # Each worker writes a file of its own: two long lines on one shared stdout may interleave.
    import tempfile
    with tempfile.TemporaryDirectory() as folder:
        code = ("import json, os, sys; json.dump(dict(os.environ), "
                "open(os.path.join(sys.argv[1], str(os.getpid()) + '.json'), 'w'))")
        result = subprocess.run([*launch, sys.executable, "-c", code, folder], env=mpirun_root_env(),
                                capture_output=True, text=True, timeout=HANG_S)
        assert result.returncode == 0, result.stderr
        envs = []
        for name in os.listdir(folder):
            with open(os.path.join(folder, name)) as f:
                envs.append(json.load(f))
    return sorted(envs, key=lambda env: int(world.launched_world(env).rank))


@pytest.mark.parametrize("launcher", ["mpirun", "srun"])
def test_world_check_reads_each_launchers_variables(launcher):
    """world.py against the variables real launchers set: the joined world passes, a world of one per worker
    (Horovod without MPI) is caught with the fix named, on every rank."""
    if launcher == "mpirun":
        require(shutil.which("mpirun") is not None, "Open MPI's mpirun")
        envs = launcher_environments(["mpirun", "-np", "2"])
    else:
        need_slurm()
        envs = launcher_environments(["srun", "-n", "2", "-t", "2"])
    assert len(envs) == 2
    for rank, env in enumerate(envs):
        assert world.launched_world(env).launcher == launcher
        assert world.world_mismatch(2, rank, rank, True, env) is None
        alone = world.world_mismatch(1, 0, 0, False, env)
        assert alone and f"{launcher} started 2 workers" in alone and "apt-get install openmpi-bin" in alone
        assert "module load" in alone and "make setup" in alone
    if launcher == "srun":  # Horovod with MPI, but srun gave the tasks no PMI
        assert "srun --mpi=pmix" in world.world_mismatch(1, 0, 0, True, envs[1])


def test_runners_probe_of_horovods_build_agrees_with_horovods_own_check():
    """runner asks Horovod's library what it was built with (horovod_build, no MXNet import); horovodrun's
    own check (a forked process per framework, importing it) must give the same answers."""
    from rn50kit.launch.horovod_build import horovod_build
    code = ("from horovod.common.util import gloo_built, mpi_built, nccl_built; "
            "print(bool(gloo_built()), bool(mpi_built()), bool(nccl_built()))")
    own = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=HANG_S, check=True)
    build = horovod_build()
    assert own.stdout.split() == [str(build["gloo"]), str(build["mpi"]), str(build["nccl"])]
    assert build["gloo"]  # make setup builds it with Gloo


def test_runner_mpi_and_slurm_need_horovod_with_mpi():
    """--launcher mpi/slurm are refused up front by a Horovod without MPI, and planned with one."""
    for launcher in ("mpi", "slurm"):
        env = {key: value for key, value in venv_env().items() if not key.startswith("SLURM_")}
        if launcher == "slurm":  # a dry run refuses what the run would: outside srun's step (its variables here)
            env.update(SLURM_STEP_NUM_TASKS="2", SLURM_MPI_TYPE="pmix")
        result = subprocess.run([sys.executable, os.path.join(ROOT, "runner"), "-n", "2", "--launcher", launcher,
                                 "--data-backend", "synthetic", "--dtype", "float32", "--dry-run"],
                                env=env, capture_output=True, text=True, timeout=HANG_S)
        if horovod_has_mpi():
            assert result.returncode == 0, result.stderr
        else:
            assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1, result.stderr
            assert "needs Horovod built with MPI" in result.stderr
            assert "apt-get install openmpi-bin libopenmpi-dev" in result.stderr


def run_runner(launch, *args, slurm_env=None):
    command = [*launch, sys.executable, os.path.join(ROOT, "runner"), *args, "--data-backend", "synthetic",
               "--dtype", "float32"]
    env = {key: value for key, value in venv_env().items() if not key.startswith("SLURM_")}
    env.update(slurm_env or {})
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=HANG_S, stdin=subprocess.DEVNULL)


def test_slurm_launcher_has_no_prefix():
    """srun has started the workers: each runner runs train.py itself (a dry run, as the run, needs srun's step:
    its variables stand for it here)."""
    need_mpi()
    result = run_runner([], "-n", "4", "-b", "8", "--launcher", "slurm", "--dry-run",
                        slurm_env={"SLURM_STEP_NUM_TASKS": "4", "SLURM_MPI_TYPE": "pmix"})
    assert result.returncode == 0, result.stderr
    command = result.stdout.strip().splitlines()[-1].split()
    assert command[0] == sys.executable and command[1] == os.path.join(ROOT, "train.py")
    assert command[command.index("--batch-size") + 1] == "32"  # the global batch of -n 4 workers


def test_slurm_launcher_outside_srun_is_one_line():
    need_mpi()
    result = run_runner([], "--launcher", "slurm")
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert "srun -n 8 ./runner --launcher slurm" in result.stderr


def test_srun_without_pmi_or_with_another_n_is_refused_before_any_work():
    need_slurm()
    no_pmi = run_runner(["srun", "--mpi=none", "-n", "1", "-t", "2"], "--launcher", "slurm")
    assert no_pmi.returncode != 0 and "srun --mpi=pmix" in no_pmi.stderr, no_pmi.stderr
    if shutil.which("ompi_info"):  # Open MPI cannot join tasks through PMI-2 either
        pmi2 = run_runner(["srun", "--mpi=pmi2", "-n", "1", "-t", "2"], "--launcher", "slurm")
        assert pmi2.returncode != 0 and "--mpi=pmi2" in pmi2.stderr and "srun --mpi=pmix" in pmi2.stderr, pmi2.stderr
    wrong_n = run_runner(["srun", "-n", "2", "-t", "2"], "--launcher", "slurm", "-n", "4")
    assert wrong_n.returncode != 0 and "-n 4 but srun started 2 tasks" in wrong_n.stderr, wrong_n.stderr
    assert "Traceback" not in no_pmi.stderr + wrong_n.stderr
