"""benchmark.py in process: its bfloat16 check, the layout a float16 GPU run computes in, baselines of another
network or mode."""
import benchmark

from rn50kit.launch import launcher as runner

from conftest import NO_BFLOAT16, EIGHT_GPU_MACHINE


def test_benchmark_checks_bfloat16_on_this_cpu_for_local_runs_only():
    assert benchmark.cpu_refuses(benchmark.peek_flags(["--dtype", "bfloat16"])) == NO_BFLOAT16
    assert benchmark.cpu_refuses(benchmark.peek_flags(["--dtype", "float32"])) is None
    for remote in (["-H", "a:2,b:2"], ["--hostfile", "hosts"], ["--launcher", "slurm"]):
        assert benchmark.cpu_refuses(benchmark.peek_flags(["--dtype", "bfloat16", *remote])) is None


def test_benchmark_reports_the_layout_a_float16_gpu_run_computes_in(data_folder):
    """benchmark.py reads the layout from runner's plan: runner no longer types the float16 defaults.
    Found by the second review of the GPU paths (issue 21)."""
    import benchmark
    _, env, command = runner.plan_launch(["-n", "8", "-b", "208", "--data-root", str(data_folder)],
                                         EIGHT_GPU_MACHINE, {})
    assert benchmark.run_settings(" ".join(command))["layout"] == {"input": "NHWC", "conv": "NHWC"}
    _, env, command = runner.plan_launch(["-n", "8", "--data-root", str(data_folder), "--data-backend", "mxnet"],
                                         EIGHT_GPU_MACHINE, {})
    assert benchmark.run_settings(" ".join(command))["layout"] == {"input": "NCHW", "conv": "NHWC"}
    _, env, command = runner.plan_launch(["-n", "8", "--dtype", "float32", "--data-root", str(data_folder)],
                                         EIGHT_GPU_MACHINE, {})
    assert benchmark.run_settings(" ".join(command))["layout"] == {"input": "NCHW", "conv": "NCHW"}


def test_a_baseline_of_another_network_or_mode_is_warned_about():
    """Found by the second newcomer walk (issue 26)."""
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
