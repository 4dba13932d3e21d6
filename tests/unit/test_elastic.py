"""Elastic runs' arithmetic and plans (rn50kit/training/elastic.py, records.ElasticOrder, runner's elastic flags),
against references written out here: the global batch a world keeps, the records each world reads, what runner
starts. The runs themselves (real horovodrun in elastic mode, workers killed and added) are
tests/e2e/test_elastic_training.py."""
import itertools
import pathlib
import subprocess
import sys

import numpy as np
import pytest

from rn50kit.config.cli import UsageError
from rn50kit.data import records
from rn50kit.launch import discovery
from rn50kit.launch.discovery import hostfile_lines
from rn50kit.launch.launchers import elastic
from rn50kit.launch.machine import Machine
from rn50kit.launch.plan import plan_launch
from rn50kit.reporting.outputs import describe_world_change
from rn50kit.training.elastic import ElasticEpoch, WorldPlan, describe_plan, plan_world
from support.runs import configured

KIT = pathlib.Path(__file__).resolve().parents[2]


def brute_force_plan(global_batch, workers, max_per_worker):
    """Every (per-worker batch, accumulation) making exactly ``global_batch``, the fewest accumulation steps first."""
    exact = [(global_batch // (workers * accum), accum) for accum in range(1, global_batch + 1)
             if global_batch % (workers * accum) == 0 and 1 <= global_batch // (workers * accum) <= max_per_worker]
    return exact[0] if exact else None


@pytest.mark.parametrize("global_batch, max_per_worker", [(24, 8), (256, 32), (16, 8), (96, 12), (7, 7)])
def test_a_world_keeps_the_global_batch_whenever_it_can(global_batch, max_per_worker):
    for workers in range(1, 9):
        plan = plan_world(global_batch, workers, max_per_worker)
        assert plan.workers == workers and 1 <= plan.per_worker <= max_per_worker
        expected = brute_force_plan(global_batch, workers, max_per_worker)
        if expected is not None:
            assert (plan.per_worker, plan.accum) == expected
            assert plan.global_batch == global_batch
        else:  # the closest a world can make, each worker's batch within what fits
            options = [workers * accum * per_worker for accum in range(1, 2 * global_batch)
                       for per_worker in range(1, max_per_worker + 1)]
            assert abs(plan.global_batch - global_batch) <= min(abs(b - global_batch) for b in options) + workers


def test_three_workers_losing_one_keep_24_by_accumulating():
    plan = plan_world(24, 2, 8)
    assert (plan.per_worker, plan.accum, plan.micro_batch, plan.global_batch) == (6, 2, 12, 24)
    assert describe_plan(plan, 24) == "2 workers x 6 images x 2 accumulation step(s) = the global batch 24"
    assert describe_plan(plan_world(16, 3, 8), 16).endswith("cannot make the global batch 16 exactly, so the LR is "
                                                            "scaled by 15/16")
    assert describe_plan(WorldPlan(2, 8, 1), 24, keep=False).endswith("--elastic-batch scale-lr, so the LR is "
                                                                      "scaled by 16/24")


def read_in_segments(total, seed, batch_sizes, worlds, updates):
    """Records each rank reads in segments of an epoch: segment i runs ``updates[i]`` global steps in a world of
    ``worlds[i]`` workers with ``batch_sizes[i]`` images each, starting where the last one stopped."""
    read, start = [], 0
    for batch, world, steps in zip(batch_sizes, worlds, updates):
        orders = [records.ElasticOrder(total, rank, world, batch, seed, start) for rank in range(world)]
        for _ in range(steps):
            for order in orders:
                read.extend(order.take(batch))
        start += world * batch * steps
    return read, start


@pytest.mark.parametrize("worlds, batches", [((3, 2), (8, 6)), ((2, 3, 1), (8, 5, 16)), ((4,), (4,))])
def test_every_world_reads_the_rest_of_the_epochs_permutation_each_record_once(worlds, batches):
    total, seed = 1000, 7
    updates = [10, 7, 3][:len(worlds)]
    read, consumed = read_in_segments(total, seed, batches, worlds, updates)
    assert len(read) == len(set(read)) == consumed  # nothing twice
    permutation = np.random.default_rng([seed, 0]).permutation(total)
    assert sorted(read) == sorted(permutation[:consumed].tolist())  # a prefix of the epoch's order
    rest = records.ElasticOrder(total, 0, 1, total - consumed, seed, consumed).take(total - consumed)
    assert sorted(read + rest) == list(range(total))  # and the rest is what a new world reads


def test_an_elastic_epoch_counts_the_steps_before_the_commit():
    epoch = ElasticEpoch(iter(range(3)), first_step=40, steps=3)
    assert len(epoch) == 43 and list(epoch) == [0, 1, 2]
    assert list(ElasticEpoch(None, 40, 0)) == []  # a commit at the epoch's last step leaves nothing to read


def test_the_world_change_line_says_what_changed_and_what_it_cost():
    line = describe_world_change({"epoch": 2, "workers_before": 3, "workers": 2, "hosts_lost": ["hostA"],
                                  "hosts_added": [], "steps_redone": 3, "detected_after": 30.2,
                                  "seconds_lost": 33.5, "plan": "2 workers x 6 images"})
    assert line.startswith("Elastic: 3 -> 2 workers in epoch 2 (lost hostA)")
    assert "3 step(s) redone" in line and "30.2 s" in line and "33.5 s" in line


def plan(argv, environ=None):
    return plan_launch([str(a) for a in argv], Machine(0, 2), environ or {})


def test_runner_starts_horovodrun_elastic_with_a_discovery_script_of_its_host_list(data_root):
    args, env, command = plan(["-n", "3", "-b", "8", "--data-root", data_root, "-H", "localhost:2,hostA:1",
                               "--min-np", "2", "--elastic-timeout", "30"])
    at = command.index("--host-discovery-script")
    assert command[command.index("--min-np") + 1] == "2" and command[command.index("--max-np") + 1] == "3"
    assert command[command.index("--elastic-timeout") + 1] == "30" and "--gloo" in command and "-H" not in command
    assert train_batch(command) == 24  # -b per worker x -n, as for any run
    printed = subprocess.run(command[at + 1], shell=True, capture_output=True, text=True, check=True).stdout
    assert printed.split() == ["localhost:2", "hostA:1"]
    # Horovod 0.28.1 crashes re-initialising after a reset with these set (elastic.ELASTIC_UNSAFE_ENV)
    assert not set(elastic.ELASTIC_UNSAFE_ENV) & set(env)
    fixed = plan(["-n", "2", "--data-root", data_root])[1]
    assert "HOROVOD_FUSION_THRESHOLD" in fixed and "HOROVOD_CYCLE_TIME" in fixed


def train_batch(command):
    return int(command[command.index("--batch-size") + 1])


def test_a_hostfile_is_read_again_at_every_discovery(data_root, tmp_path):
    hostfile = tmp_path / "hosts"
    hostfile.write_text("localhost slots=2\n")
    _, _, command = plan(["-n", "2", "--max-np", "3", "--data-root", data_root, "--hostfile", hostfile])
    script = command[command.index("--host-discovery-script") + 1]
    assert subprocess.run(script, shell=True, capture_output=True, text=True).stdout.split() == ["localhost:2"]
    hostfile.write_text("localhost slots=2\nhostA slots=1  # added\n")
    assert subprocess.run(script, shell=True, capture_output=True, text=True).stdout.split() == \
        ["localhost:2", "hostA:1"]
    assert hostfile_lines("# none\n\nh1\nh2 slots=4\n") == ["h1:1", "h2:4"]


@pytest.mark.parametrize("flags, says", [
    (["--min-np", "2", "--launcher", "mpi"], "horovodrun's elastic driver"),
    (["--min-np", "3"], "--min-np <= -n <= --max-np"),
    (["--reset-limit", "2"], "--reset-limit is for elastic runs"),
    (["--min-np", "1", "--host-discovery-script", "d.sh", "-H", "h:2"], "either --host-discovery-script"),
])
def test_elastic_flags_that_cannot_work_are_refused_in_one_line(data_root, flags, says):
    with pytest.raises(UsageError) as refused:
        plan(["-n", "2", "--data-root", data_root, *flags])
    assert says in str(refused.value) and "\n" not in str(refused.value)


def test_runner_refuses_an_elastic_run_on_synthetic_data_before_any_worker_starts(data_root, capsys):
    """In runner's own process, from train.py's flags (rn50kit.config.train_flags.check with elastic): the
    backend's line, not the workers' (the fault campaign's finding: every worker started, then refused)."""
    from rn50kit.launch import train_flags
    with pytest.raises(SystemExit) as refused:
        train_flags.check_train_flags(["--data-backend", "synthetic"], {"elastic": True})
    line = capsys.readouterr().err.strip()
    assert refused.value.code == 2 and "\n" not in line, line
    assert line.endswith("--data-backend synthetic cannot: use dali-cpu or dali-gpu"), line
    assert train_flags.check_train_flags(["--data-backend", "synthetic"]) is None  # a fixed world reads it


def test_a_discovery_script_places_workers_beyond_this_machines_cores(data_root):
    _, _, command = plan(["-n", "8", "--data-root", data_root, "--host-discovery-script", "discover.sh"])
    assert command[command.index("-np") + 1] == "8" and command[command.index("--max-np") + 1] == "8"


def test_the_discovery_script_runs_on_the_standard_library_alone(tmp_path):
    script = [sys.executable, "-I", discovery.__file__, "--hosts", "a:2,b"]
    assert subprocess.run(script, capture_output=True, text=True, check=True).stdout.split() == ["a:2", "b:1"]
    missing = [sys.executable, "-I", script[2], "--hostfile", tmp_path / "gone"]
    assert subprocess.run(missing, capture_output=True, text=True, check=True).stdout.strip() == ""


def test_plans_cover_every_small_world():
    for global_batch, workers in itertools.product(range(1, 40), range(1, 6)):
        plan = plan_world(global_batch, workers, max(1, global_batch // 2))
        assert plan.per_worker >= 1 and plan.accum >= 1


@pytest.mark.parametrize("flags, says", [
    (["--data-train", "train.rec", "--data-backend", "mxnet"], "--data-backend mxnet cannot: use dali-cpu or dali-gpu"),
    (["--data-backend", "synthetic"], "--data-backend synthetic cannot: use dali-cpu or dali-gpu"),
    (["--data-train", "train.rec", "--horovod-num-groups", "4"], "elastic runs allreduce the gradients as one group"),
])
def test_an_elastic_worker_refuses_what_an_elastic_run_cannot_do_in_one_line(tmp_path, flags, says):
    """Checked in the worker (elastic_setup.elastic_training), before the network or any collective; synthetic
    data (no --data-train) is refused for its backend, not for the training data it does not need."""
    import mxnet as mx

    from rn50kit.config.cli import UsageError
    from rn50kit.training import elastic_setup
    from rn50kit.training.distributed import Distributed
    argv = ["--kv-store", "horovod", *flags]
    cfg = configured(argv)
    dist = Distributed(None)
    dist.elastic = True
    with pytest.raises(UsageError) as refused:
        elastic_setup.elastic_training(cfg, None, [mx.cpu()], dist, None)
    assert says in str(refused.value) and "\n" not in str(refused.value)
