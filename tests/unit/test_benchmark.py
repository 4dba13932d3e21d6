"""benchmark.py in process: its bfloat16 check, the layout a float16 GPU run computes in, baselines of another
network or mode."""
import pytest

import benchmark
from rn50kit.benchmarking import runs
from rn50kit.benchmarking.results import baseline_problems, combine_runs, metric_keys, summarize
from rn50kit.benchmarking.runs import run_settings
from rn50kit.benchmarking.sweep import Sweep, command_builder, next_untimed
from rn50kit.benchmarking.tables import model_title, tables, warmup_lines
from rn50kit.launch.plan import plan_launch
from support.networks import NO_BFLOAT16
from support.runs import EIGHT_GPU_MACHINE


def test_benchmark_checks_bfloat16_on_this_cpu_for_local_runs_only():
    assert benchmark.cpu_refuses(benchmark.peek_flags(["--dtype", "bfloat16"])) == NO_BFLOAT16
    assert benchmark.cpu_refuses(benchmark.peek_flags(["--dtype", "float32"])) is None
    for remote in (["-H", "a:2,b:2"], ["--hostfile", "hosts"], ["--launcher", "slurm"]):
        assert benchmark.cpu_refuses(benchmark.peek_flags(["--dtype", "bfloat16", *remote])) is None


def test_benchmark_reports_the_layout_a_float16_gpu_run_computes_in(data_folder):
    """benchmark.py reads the layout from runner's plan: runner no longer types the float16 defaults.
    Found by the second review of the GPU paths (issue 21)."""
    _, env, command = plan_launch(["-n", "8", "-b", "208", "--data-root", str(data_folder)],
                                  EIGHT_GPU_MACHINE, {})
    assert run_settings(" ".join(command))["layout"] == {"input": "NHWC", "conv": "NHWC"}
    _, env, command = plan_launch(["-n", "8", "--data-root", str(data_folder), "--data-backend", "mxnet"],
                                  EIGHT_GPU_MACHINE, {})
    assert run_settings(" ".join(command))["layout"] == {"input": "NCHW", "conv": "NHWC"}
    _, env, command = plan_launch(["-n", "8", "--dtype", "float32", "--data-root", str(data_folder)],
                                  EIGHT_GPU_MACHINE, {})
    assert run_settings(" ".join(command))["layout"] == {"input": "NCHW", "conv": "NCHW"}


def test_a_baseline_of_another_network_or_mode_is_warned_about():
    """Found by the second newcomer walk (issue 26)."""
    cell = {"train.total_ips": 10.0}
    result = {"model": "resnet50_v1.5", "image_shape": "3,224,224", "mode": "train", "dtype": "bfloat16",
              "metrics": {"1": {"16": cell}}}
    same = {"model": "resnet50_v1.5", "image_shape": "3,224,224", "mode": "train", "dtype": "float32",
            "metrics": {"1": {"16": {"train.total_ips": 5.0}}}}
    assert baseline_problems(result, same) == []  # another dtype is what a baseline is for
    other = dict(same, model="resnet18_v1.5", image_shape="3,32,32", mode="val")
    problems = baseline_problems(result, other)
    assert problems == ["the baseline's network is resnet18_v1.5, this sweep's resnet50_v1.5",
                        "the baseline's image shape is 3,32,32, this sweep's 3,224,224",
                        "the baseline's mode is val, this sweep's train"]
    disjoint = dict(same, metrics={"2": {"64": {"train.total_ips": 5.0}}})
    assert "none of this sweep's worker counts and batch sizes" in baseline_problems(result, disjoint)[0]
    assert model_title(result) == "resnet50_v1.5, 3x224x224"


def report_of(untimed, timed=(1.0, 1.0, 1.0)):
    """A run's report of one training epoch: ``untimed`` step times, then ``timed`` ones."""
    from rn50kit.reporting import report
    assert len(untimed) == report.WARMUP_ITERATIONS
    run = report.Report("m", 1, [])
    run.add_epoch("train", durations=[*untimed, *timed], batch_size=4)
    return run.to_dict()


def test_each_run_says_when_its_step_time_was_steady_and_the_sweep_keeps_the_slowest():
    """A run whose untimed iterations levelled off says after how many; one still speeding up at the last of them
    is said NOT steady, and a configuration is as steady as its slowest run (issue 44)."""
    keys = metric_keys("train")
    quick = report_of([5.0, 2.0] + [1.0] * 18)  # the first two build the graph: the medians agree from the 7th
    slow = report_of([2.0] * 10 + [1.0] * 10)  # a plateau, then a step down to 1 s after ten: steady again at 15
    never = report_of([2.0 * 0.9 ** i for i in range(20)])  # 10 % faster every iteration, to the end
    assert quick["metrics"]["train.steady_after"] == [7]
    cells = [summarize(r, keys, 1, 0, 3) for r in (quick, slow, never)]
    assert [c["train.steady_after"] for c in cells] == [7, 15, None]
    assert combine_runs(cells[:2])["train.steady_after"] == 15
    assert combine_runs(cells)["train.steady_after"] is None
    assert combine_runs(cells)["train.total_ips"] == 4.0  # the other metrics as before
    result = {"metrics": {"1": {"4": combine_runs(cells[:2]), "8": combine_runs(cells)}},
              "ngpus": [1], "bs": [4, 8], "metric_keys": keys, "failed": [], "dtype": "float32", "timed_iters": 3}
    assert warmup_lines(result, ["train"]) == [
        "- n=1 bs=4 train: steady after 15 of 20 untimed iterations",
        "- n=1 bs=8 train: NOT steady within the 20 untimed iterations: not a steady state's figure"]
    assert "### Warm-up" in tables(result)


def test_a_short_epoch_leaves_nothing_out_and_says_nothing_of_steadiness():
    from rn50kit.reporting import report
    run = report.Report("m", 1, [])
    run.add_epoch("train", durations=[1.0] * 5, batch_size=4)
    assert "train.steady_after" not in run.metrics and run.metrics["train.timed_iters"] == [5]


def test_a_configuration_not_steady_gets_twice_the_untimed_iterations_up_to_what_it_may_have():
    args = benchmark.get_args_parser().parse_args(["-i", "10", "--max-untimed-iters", "100"])
    assert [next_untimed(args, 1, 8, u) for u in (20, 40, 80, 100)] == [40, 80, 100, None]
    args.num_examples = 8 * 2 * 60  # 60 iterations of 2 workers x 8: 10 timed leave room for 50 untimed
    assert [next_untimed(args, 2, 8, u) for u in (20, 40, 50)] == [40, 50, None]
    args.mode = "val"  # a validation set is cycled: --num-examples does not bound it
    assert next_untimed(args, 2, 8, 50) == 100


def test_a_report_says_how_many_iterations_it_left_out_and_reads_back(tmp_path):
    from rn50kit.reporting import report
    run = report.Report("m", 1, [], untimed_iters=8)
    run.add_epoch("train", durations=[3.0] * 8 + [1.0, 1.0], batch_size=4)
    assert run.metrics["train.timed_iters"] == [2] and run.metrics["train.total_ips"] == [4.0]
    run.save(tmp_path / "r.json")
    assert report.Report.load(tmp_path / "r.json").untimed_iters == 8


@pytest.mark.parametrize("untimed", ["3", "200"])
def test_untimed_iterations_too_few_to_judge_or_above_the_most_are_refused(untimed, capsys):
    with pytest.raises(SystemExit):
        benchmark.main(["--untimed-iters", untimed, "--dry-run", "-o", "/nonexistent-dir/x.json"])
    assert "--untimed-iters " + untimed in capsys.readouterr().err



def test_a_rerun_that_fails_keeps_the_run_before_it(tmp_path, monkeypatch, capsys):
    """The run with 20 untimed iterations is not steady; its rerun with 40 fails (a timeout): the sweep keeps the
    first run, said NOT steady, rather than no figure, and names the command that made it."""
    import json
    args = benchmark.get_args_parser().parse_args(["-i", "3", "--mode", "train", "-o", str(tmp_path / "x.json")])
    keys = metric_keys("train")
    never = report_of([2.0 * 0.9 ** i for i in range(20)])  # still speeding up at its 20th iteration
    build = command_builder(args, tmp_path / "x.json", tmp_path, [], None)
    outcomes = iter([None, "timed out after 60 s"])

    def run_one(command, timeout):
        reason = next(outcomes)
        if reason is None:
            (tmp_path / "x-1,4.json").write_text(json.dumps(never))
        return reason
    monkeypatch.setattr(runs, "run_one", run_one)
    result = benchmark.new_result(args, "float32", keys, [])
    result["runs"] = {"1": {"4": {"runner": ["planned"]}}}
    sweep = Sweep(args, keys, None, result, tmp_path / "x.json", build)
    sweep.run_until_steady(1, 4, 0, "", build(1, 4, 0))
    cell = result["metrics"]["1"]["4"]
    assert cell["train.steady_after"] is None and cell["untimed_iters"] == 20 and cell["train.total_ips"] == 4.0
    assert "--untimed-iters 20" in result["runs"]["1"]["4"]["runner"][0]
    assert sorted(p.name for p in tmp_path.glob("x-*.json")) == ["x-1,4.json"]  # nothing set aside is left
    assert next(outcomes, "both ran") == "both ran"
    assert "the run with 40 untimed iterations failed (timed out after 60 s); keeping the one with 20" in \
        capsys.readouterr().err
