"""Every bfloat16 branch runs its Python code on any CPU: dtype handling, casts to MXNet's bfloat16 and the AMP
graph. Only oneDNN's bfloat16 kernels depend on the CPU (AVX-512): without them each test checks the one-line
refusal and that the kernel, and nothing before it, is what fails; with them it checks the numbers against
float32. (train.py's bfloat16 training against float32: tests/test_train_precision.py.)"""
import json
import os
import subprocess
import sys

import mxnet as mx
import numpy as np
import pytest

from conftest import HANG_S, ROOT, venv_env

import bench_models
import benchmark
from rn50kit.launch import launcher as runner
import models
from rn50kit.config import settings
import train

NO_BFLOAT16 = settings.bfloat16_unsupported()  # None where this CPU has oneDNN's bfloat16 kernels
TINY_TRAIN = ["--kv-store", "local", "--data-backend", "synthetic", "--num-layers", "18", "--num-classes", "10",
              "--image-shape", "3,32,32", "--batch-size", "8", "--num-examples", "16", "--num-epochs", "1",
              "--warmup-epochs", "0", "--seed", "7"]
# train.py with its CPU check lifted: its bfloat16 code runs as far as this CPU lets it.
UNGATED_TRAIN = """import sys
from rn50kit.common import rules
rules.bfloat16_problem = lambda dtype, flags=None: None
import train
train.run(sys.argv[1:])
"""


def run(command, timeout=HANG_S):  # the timeout only guards against a hang
    return subprocess.run(command, env=venv_env(), capture_output=True, text=True, timeout=timeout)


def error_lines(stderr):
    return [line for line in stderr.splitlines() if "error:" in line]


def failed_in_the_bfloat16_convolution(result):
    """The run got through its Python code and died in oneDNN's bfloat16 convolution, the kernel this CPU lacks."""
    assert result.returncode != 0, result.stderr[-3000:]
    assert "mkldnn_convolution" in result.stderr and "could not create a primitive descriptor" in result.stderr
    last = result.stderr.strip().splitlines()[-1]  # train.py says it in one line; a tool ends in the traceback
    assert last.startswith(("train.py: error: MXNet failed: MXNetError: could not create a primitive descriptor",
                            "mxnet.base.MXNetError")), result.stderr[-3000:]


def test_cpu_checks_agree(tmp_path):
    """bench_models' check (its PyTorch worker has no MXNet) is train.py's rule, against the flags each sample
    lacks."""
    samples = {"fpu sse2 avx avx2 fma": "avx512f, avx512bw, avx512vl, avx512dq",
               "avx2 avx512f avx512bw avx512vl": "avx512dq", "avx2 avx512f avx512dq avx512bw avx512vl": None,
               "avx512f avx512dq avx512bw avx512vl avx512_bf16 amx_bf16": None, "": None}  # "": flags unreadable
    for number, (flags, missing) in enumerate(samples.items()):
        path = tmp_path / f"cpuinfo{number}"
        path.write_text(f"processor\t: 0\nflags\t\t: {flags}\n" if flags else "processor\t: 0\n")
        ours, train_py = bench_models.bfloat16_missing(str(path)), settings.bfloat16_unsupported(str(path))
        if missing is None:
            assert ours is None and train_py is None, flags
        else:
            assert f"AVX-512 (oneDNN's bfloat16 kernels) and this one lacks {missing};" in ours, ours
            assert ours == train_py  # one rule (rules.bfloat16_problem), one wording
    assert (bench_models.bfloat16_missing() is None) == (NO_BFLOAT16 is None)


def test_bench_models_bfloat16_operands_and_matrix_product():
    """The ceiling's matrix product: its operands cast to MXNet's bfloat16 on any CPU (the cast that failed on an
    AVX-512 machine: dtype="bfloat16" is no NumPy dtype); the product itself needs oneDNN's bfloat16 kernel."""
    with pytest.raises(TypeError, match="bfloat16"):  # why bench_models casts with mxnet_bfloat16()
        mx.nd.amp_cast(mx.nd.ones((2, 2)), dtype="bfloat16")
    mx.random.seed(3)
    low = bench_models.mxnet_matrix_products(mx, "bfloat16", size=64)["bfloat16"]
    mx.random.seed(3)
    full = bench_models.mxnet_matrix_products(mx, "float32", size=64)["float32"]
    for x, reference in zip(low.operands, full.operands):
        assert x.dtype == bench_models.mxnet_bfloat16() and bench_models.dtype_name(x.dtype) == "bfloat16"
        back = mx.nd.amp_cast(x, dtype="float32").asnumpy()
        error = np.abs(back - reference.asnumpy()).max()
        assert 0 < error <= 2 ** -8  # bfloat16 keeps 8 bits of mantissa; |values| < 1
    expected = full().asnumpy()
    if NO_BFLOAT16:
        with pytest.raises(mx.base.MXNetError, match="primitive descriptor"):
            low().wait_to_read()
        return
    got = mx.nd.amp_cast(low(), dtype="float32").asnumpy()
    error = np.abs(got - expected).max() / np.abs(expected).max()
    assert 0 < error < 0.02, error


def test_runner_passes_bfloat16_to_train_py_on_a_cpu_and_refuses_it_on_gpus(tmp_path):
    for name in ("train.rec", "train.idx", "val.rec", "val.idx"):
        (tmp_path / name).write_bytes(b"")
    _, _, command = runner.plan_launch(["-n", "1", "--dtype", "bfloat16", "--data-root", str(tmp_path)],
                                       runner.Machine(0, 8), {})
    args = train.parse_args(command[next(i for i, w in enumerate(command) if w.endswith("train.py")) + 1:])
    assert args.dtype == "bfloat16"
    net = models.get_model_from_args(args)  # as train.py builds it for AMP: float32 parameters, float32 logits
    assert net.dtype == "bfloat16"
    net.initialize()
    net.infer_shape(mx.nd.zeros((1, 3, 224, 224)))
    assert {np.dtype(p.dtype) for p in net.collect_params().values()} == {np.dtype(np.float32)}
    _, (logits,), _ = net(mx.sym.var("data")).infer_type(data="float32")
    assert np.dtype(logits) == np.float32
    with pytest.raises(runner.UsageError, match="bfloat16 runs on the CPU only"):
        runner.plan_launch(["-n", "1", "--dtype", "bfloat16", "--data-root", str(tmp_path)],
                           runner.Machine(8, 64), {})


def test_benchmark_checks_bfloat16_on_this_cpu_for_local_runs_only():
    assert benchmark.cpu_refuses(benchmark.peek_flags(["--dtype", "bfloat16"])) == NO_BFLOAT16
    assert benchmark.cpu_refuses(benchmark.peek_flags(["--dtype", "float32"])) is None
    for remote in (["-H", "a:2,b:2"], ["--hostfile", "hosts"], ["--launcher", "slurm"]):
        assert benchmark.cpu_refuses(benchmark.peek_flags(["--dtype", "bfloat16", *remote])) is None


def test_bench_models_sums_onednn_kernels_of_the_marked_steps_only():
    log = "\n".join([
        "dnnl_verbose,info,oneDNN v2.4.4",
        "dnnl_verbose,exec,cpu,convolution,jit:avx2,forward_training,src_f32,,alg:convolution_direct,mb2_ic3oc64,9.0",
        bench_models.BREAKDOWN_MARKS[0],
        "dnnl_verbose,exec,cpu,convolution,jit:avx2,forward_training,src_f32,,alg:convolution_direct,mb2_ic3oc64,2.5",
        "dnnl_verbose,exec,cpu,reorder,jit:uni,undef,src_f32::blocked:abcd:f0 dst_f32,,,64x3x7x7,0.25",
        "a line of the network's own output",
        "dnnl_verbose,exec,cpu,convolution,jit:avx2,backward_data,src_f32,,alg:convolution_direct,mb2_ic3oc64,1.5",
        bench_models.BREAKDOWN_MARKS[1] + " after 20.000 ms",
        "dnnl_verbose,exec,cpu,convolution,jit:avx2,forward_training,src_f32,,alg:convolution_direct,mb2,7.0"])
    totals, wall_ms = bench_models.kernel_times(log)
    assert totals == {"convolution": 4.0, "reorder": 0.25} and wall_ms == 20.0
    breakdown = bench_models.step_breakdown(totals, steps=2, wall_ms=wall_ms)
    assert breakdown["step_ms"] == 10.0
    assert breakdown["kernels_ms"] == {"convolution": 2.0, "reorder": 0.125}
    assert breakdown["matrix_product_share"] == pytest.approx(0.2) and breakdown["overhead_share"] == pytest.approx(0.8)
    assert breakdown["outside_onednn_ms"] == pytest.approx(10.0 - 2.125)


@pytest.mark.slow
def test_bench_models_bfloat16_worker_builds_everything_and_times_where_the_cpu_can(tmp_path):
    """A tiny bench_models run, without PyTorch: float32 and INT8 timed; the bfloat16 worker builds its AMP graph
    (every convolution fed bfloat16, float32 logits) and casts its operands on any CPU, then is timed and its
    logits compared with float32's (the same weights and image) where oneDNN has bfloat16 kernels, or reported as
    not measured, with the reason, where not."""
    out = tmp_path / "bench.json"
    result = run([sys.executable, os.path.join(ROOT, "tools", "bench_models.py"), "--model", "resnet18_v1.5",
                  "--batch-size", "2", "--image-size", "32", "--iters", "1", "--warmup", "0", "--rounds", "1",
                  "--json", str(out)])
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(out.read_text())
    rates = report["images_per_s"]
    for key in ("ours float32 training step", "ours float32 inference", "ours int8 inference"):
        assert rates[key]["median"] > 0, key
    assert report["ceilings"]["mxnet-float32"]["float32"] > 0 and report["ceilings"]["mxnet-int8"]["int8"] > 0
    for kind, ceilings in report["ceilings"].items():  # measured at the start and again in the round; the best kept
        for precision, best in ceilings.items():
            measures = report["ceiling_samples"][kind][precision]
            assert len(measures) == 2 and best == max(measures), (kind, precision, measures)
    built = report["built"]
    assert built["mxnet-float32"]["bfloat16 convolutions"] == 0
    assert built["mxnet-bfloat16"]["bfloat16 convolutions"] == built["mxnet-bfloat16"]["convolutions"] == \
        built["mxnet-float32"]["convolutions"] > 0
    assert built["mxnet-bfloat16"]["logits"] == built["mxnet-float32"]["logits"] == ["float32", [2, 1000]]
    assert built["mxnet-bfloat16"]["operands"] == ["bfloat16", "bfloat16"]
    assert built["mxnet-float32"]["operands"] == ["float32", "float32"]
    convolutions = built["mxnet-float32"]["convolutions"]
    assert f"built: mxnet-bfloat16  {convolutions}/{convolutions} convolutions take bfloat16" in result.stdout
    # The oneDNN kernel breakdown of the float32 step (bfloat16's only where it was timed).
    breakdown = report["breakdown"]["ours float32 training step"]
    kernels = breakdown["kernels_ms"]
    assert kernels["convolution"] > 0 and kernels["batch_normalization"] > 0 and "reorder" in kernels
    products = kernels["convolution"] + kernels.get("inner_product", 0) + kernels.get("matmul", 0)
    assert breakdown["matrix_product_share"] == pytest.approx(products / breakdown["step_ms"])
    assert breakdown["outside_onednn_ms"] == pytest.approx(breakdown["step_ms"] - sum(kernels.values()))
    assert breakdown["outside_onednn_ms"] > 0  # the kernels ran inside the steps' wall time, in one process
    assert "breakdown: ours float32 training step: matrix products " in result.stdout
    assert ("ours bfloat16 training step" in report["breakdown"]) == (not NO_BFLOAT16)
    if NO_BFLOAT16:
        reason = report["not_measured"]["mxnet-bfloat16"]
        assert "AVX-512" in reason and f"not measured: mxnet-bfloat16: {reason}" in result.stdout
        assert not any("bfloat16" in key for key in rates) and report["ceilings"]["mxnet-bfloat16"] == {}
        assert report["bfloat16_logits_difference"] is None
        return
    assert "mxnet-bfloat16" not in report["not_measured"]
    for key in ("ours bfloat16 training step", "ours bfloat16 inference"):
        assert rates[key]["median"] > 0, key
    assert report["ceilings"]["mxnet-bfloat16"]["bfloat16"] > 0
    assert 0 < report["bfloat16_logits_difference"] < 0.05  # bfloat16 arithmetic: close, and not float32's


@pytest.mark.slow
def test_benchmark_bfloat16_refused_in_one_line_or_swept_against_float32(tmp_path):
    sweep = [sys.executable, os.path.join(ROOT, "benchmark.py"), "-n", "1", "-b", "2", "-i", "2", "-e", "1",
             "--only-inference", "--data-backend", "synthetic", "--num-layers", "18", "--image-shape", "3,32,32",
             "--num-classes", "10"]
    out = tmp_path / "out" / "bf16.json"
    if NO_BFLOAT16:
        result = run(sweep + ["--dtype", "bfloat16", "-o", str(out)])
        assert result.returncode == 2 and result.stdout == "", result.stdout[-2000:] + result.stderr[-2000:]
        assert result.stderr.splitlines() == [f"benchmark: error: {NO_BFLOAT16}"]
        assert not out.parent.exists()  # refused before anything: no run, no result file
        return
    baseline = tmp_path / "out" / "fp32.json"
    assert run(sweep + ["--dtype", "float32", "-o", str(baseline)]).returncode == 0
    result = run(sweep + ["--dtype", "bfloat16", "-o", str(out), "--baseline", str(baseline)])
    assert result.returncode == 0, result.stderr[-3000:]
    data = json.loads(out.read_text())
    assert data["dtype"] == "bfloat16" and data["failed"] == []
    assert data["metrics"]["1"]["2"]["val.total_ips"] > 0
    assert data["speedup"]["1"]["2"] > 0


@pytest.mark.slow
def test_train_py_bfloat16_scores_close_to_float32_or_only_the_kernel_fails(tmp_path):
    """train.py --dtype bfloat16 (AMP, the network, scoring; the training loop where refused). Without bfloat16
    kernels: --mode val is refused in one line, and with the check lifted the run gets through all its Python
    code (AMP, network, data, scoring or training loop) to the first bfloat16 convolution, which fails: the
    refusal is needed and comes before anything else would fail. With them: fresh weights (one seed) score in
    bfloat16 close to float32, not equal."""
    train_py = os.path.join(ROOT, "train.py")
    if NO_BFLOAT16:
        result = run([sys.executable, train_py, *TINY_TRAIN, "--mode", "val", "--dtype", "bfloat16",
                      "--workspace", str(tmp_path / "refused")])
        errors = error_lines(result.stderr)
        assert result.returncode == 2 and len(errors) == 1 and "AVX-512" in errors[0], result.stderr[-2000:]
        assert "Traceback" not in result.stderr and not (tmp_path / "refused" / "score.json").exists()
        for mode, started in (("val", "Scoring freshly initialised weights"), ("train", "Training resnet18_v1.5")):
            result = run([sys.executable, "-c", UNGATED_TRAIN, *TINY_TRAIN, "--mode", mode, "--dtype", "bfloat16",
                          "--workspace", str(tmp_path / mode)])
            assert started in result.stderr, result.stderr[-3000:]
            # Training runs AMP's patched operators; one worker scoring casts its fused graph without them.
            assert ("Using AMP" in result.stderr) == (mode == "train"), result.stderr[-3000:]
            failed_in_the_bfloat16_convolution(result)
        return
    losses = {}
    for dtype in ("float32", "bfloat16"):
        result = run([sys.executable, train_py, *TINY_TRAIN, "--mode", "val", "--dtype", dtype,
                      "--workspace", str(tmp_path / dtype)])
        assert result.returncode == 0, result.stderr[-3000:]
        losses[dtype] = json.loads((tmp_path / dtype / "score.json").read_text())["metrics"]["val.loss"][0]
    assert losses["float32"] != losses["bfloat16"]  # the same weights and data: bfloat16 arithmetic differs
    assert abs(losses["bfloat16"] - losses["float32"]) <= 0.05 * abs(losses["float32"]), losses
