"""examples/*.sh: valid bash, the original's settings, and extra arguments passed on."""
import glob
import os
import subprocess

import pytest

from support.processes import HANG_S, ROOT, venv_env

pytestmark = pytest.mark.slow  # launches processes or trains end to end


SCRIPTS = sorted(glob.glob(os.path.join(ROOT, "examples", "*.sh")))


NAMES = [os.path.basename(s) for s in SCRIPTS]


# Extra arguments that make any script runnable here as a dry run: the later flag wins, so these also
# prove the arguments reach the command (float16 and -n 8 would be refused on a CPU machine; the marker is a
# real train.py flag with an unusual value: a dry run refuses unknown flags, as the run does).
# Small images: every batch the scripts set fits this machine's memory in float32 (runner's dry run refuses one that
# does not, before launching).
OVERRIDES = ["-n", "1", "--dtype", "float32", "--data-backend", "synthetic", "--image-shape", "3,64,64", "--dry-run",
             "--disp-batches", "42"]


def test_all_scripts_exist():
    expected = {f"RN50_{p}_{n}.sh" for p in ("FP16", "FP32") for n in (1, 4, 8)} | {
        "BENCHMARK_FP16.sh", "BENCHMARK_FP32.sh", "INFER_BENCHMARK_FP16.sh", "INFER_BENCHMARK_FP32.sh",
        "SCORE_FP16.sh", "SCORE_FP32.sh", "RN50_CPU_FP32.sh", "RN50_CPU_BF16.sh"}
    assert expected <= set(NAMES)


@pytest.mark.parametrize("script", SCRIPTS, ids=NAMES)
def test_bash_syntax_and_executable(script):
    assert subprocess.run(["bash", "-n", script]).returncode == 0
    assert os.access(script, os.X_OK)


def run(script, *args):
    return subprocess.run([script, *args], env=venv_env(), capture_output=True, text=True, timeout=HANG_S)


def words_after(line, flag):
    words = line.split()
    return [words[i + 1] for i, w in enumerate(words) if w == flag]


@pytest.mark.parametrize("script", [s for s in SCRIPTS if "RN50_" in s], ids=[n for n in NAMES if "RN50_" in n])
def test_training_scripts_forward_arguments(script):
    result = run(script, *OVERRIDES)
    assert result.returncode == 0, result.stderr
    command = result.stdout.strip().splitlines()[-1]
    assert command.split()[-2:] == ["--disp-batches", "42"]
    name = os.path.basename(script)
    per_worker = 208 if "FP16" in name else 96 if "FP32_" in name else 32
    assert words_after(command, "--batch-size") == [str(per_worker)]  # -n 1: global = per worker


@pytest.mark.parametrize("script", [s for s in SCRIPTS if "BENCHMARK" in s], ids=[n for n in NAMES if "BENCHMARK" in n])
def test_benchmark_scripts_forward_arguments(script, tmp_path):
    result = run(script, *OVERRIDES, "-o", str(tmp_path / "b.json"))
    assert result.returncode == 0, result.stderr
    lines = result.stdout.strip().splitlines()
    name = os.path.basename(script)
    sizes = {"BENCHMARK_FP16.sh": [64, 128, 192, 208], "BENCHMARK_FP32.sh": [32, 64, 96],
             "INFER_BENCHMARK_FP16.sh": [1, 2, 4, 64, 128, 192, 208], "INFER_BENCHMARK_FP32.sh": [1, 2, 4, 32, 64, 96]}
    assert [int(words_after(line, "-b")[0]) for line in lines] == sizes[name]
    for line in lines:
        assert line.split()[-2:] == ["--disp-batches", "42"]
        assert words_after(line, "--mode") == (["val"] if "INFER" in name else ["train"])


@pytest.mark.parametrize("precision", ["FP16", "FP32", "INT8"])
def test_score_scripts_find_the_checkpoint_and_forward(precision, tmp_path):
    script = os.path.join(ROOT, "examples", f"SCORE_{precision}.sh")
    import mxnet as mx  # a readable parameter file: a damaged --load is refused before any worker starts
    mx.nd.save(str(tmp_path / "model-0003.params"), {"arg:w": mx.nd.zeros((1,))})
    result = run(script, str(tmp_path / "model"), "3", *OVERRIDES)
    assert result.returncode == 0, result.stderr
    command = result.stdout.strip().splitlines()[-1]
    assert words_after(command, "--load") == [str(tmp_path / "model-0003.params")]
    assert words_after(command, "--mode") == ["val"] and command.split()[-2:] == ["--disp-batches", "42"]
    missing = run(script, str(tmp_path / "model"), "4")
    assert missing.returncode == 2 and "model-0004.params" in missing.stderr
    assert len(missing.stderr.strip().splitlines()) == 1
