"""The configuration home, rn50kit/config: train.py's complete parser built and a full command line parsed and checked
in a Python where MXNet cannot be imported; nothing read at import (a malformed recipe is one line when used); the
in-process check runner calls (train_flags.check) refusing as train.py's own check does."""
import dataclasses
import json
import shutil
import subprocess
import sys

import pytest

from rn50kit.config import cli, recipe, train_flags
from rn50kit.config.fit_flags import FitConfig
from support.processes import HANG_S, ROOT, venv_env

# One flag of every group at least, the way runner passes them (train.py's own names)
FULL_COMMAND = ["--mode", "train_val", "--recipe", "rsb-a3", "--seed", "3", "--kv-store", "horovod", "--batch-size",
                "64", "--grad-accum-steps", "2", "--num-epochs", "4", "--optimizer", "lamb", "--opt-betas", "0.9,0.99",
                "--opt-eps", "1e-8", "--wd", "0.02", "--lr-schedule", "cosine", "--warmup-epochs", "1",
                "--label-smoothing", "0.1", "--mixup", "0.2", "--cutmix", "1.0", "--ema-decay", "0.999", "--dtype",
                "float32", "--workspace", "runs/x", "--keep-last", "2", "--json-log", "log.jsonl", "--num-layers", "18",
                "--num-classes", "10", "--drop-path", "0.05", "--data-backend", "dali-cpu", "--image-shape", "3,32,32",
                "--data-val-resize", "32", "--train-size", "24,32", "--train-size-epochs", "1,3", "--auto-augment",
                "randaugment", "--color-jitter", "0.4", "--dali-threads", "2", "--dali-read-ahead", "1",
                "--backbone-lr-mult", "0.5", "--calib-mode", "entropy", "--pred-top-k", "3", "--stall-timeout", "60"]


def test_the_parser_builds_and_a_full_command_line_parses_and_checks_without_mxnet():
    code = ("import json, sys\n"
            "for name in ('mxnet', 'horovod', 'horovod.mxnet', 'nvidia', 'nvidia.dali', 'cv2', 'numpy'):\n"
            "    sys.modules[name] = None  # importing any of them now fails\n"
            "from rn50kit.config import train_config, train_flags\n"
            "argv = json.loads(sys.argv[1])\n"
            "parser = train_flags.get_args_parser()\n"
            "train_flags.check(argv)\n"
            "args = train_flags.parse_args(argv)\n"
            "train_flags.fill_hyper_parameters(args, train_flags.given_flags(argv))\n"
            "cfg = train_config.from_args(args)\n"
            "print(json.dumps({'groups': [g.title for g in parser._action_groups], 'optimizer': cfg.fit.optimizer,\n"
            "                  'betas': cfg.fit.opt_betas, 'eps': cfg.fit.opt_eps, 'lr': cfg.fit.lr,\n"
            "                  'shape': cfg.data.image_shape, 'layers': cfg.model.num_layers,\n"
            "                  'stall': cfg.watchdog.stall_timeout, 'calib': cfg.quantize.calib_mode}))\n")
    result = subprocess.run([sys.executable, "-c", code, json.dumps(FULL_COMMAND)], cwd=ROOT, env=venv_env(),
                            capture_output=True, text=True, timeout=HANG_S)
    assert result.returncode == 0, result.stderr[-2000:]
    seen = json.loads(result.stdout)
    assert {"Model", "Run", "Optimizer", "LR schedule", "Data", "Augmentation", "DALI data backend", "Fine-tuning",
            "INT8", "Prediction", "Faults"} <= set(seen["groups"])
    assert (seen["optimizer"], seen["betas"], seen["eps"]) == ("lamb", [0.9, 0.99], 1e-8)
    # rsb-a3's LR per 256 for the effective batch 64 x 2 (its file: lr_per_256 = 0.008)
    assert seen["lr"] == pytest.approx(recipe.load_recipe("rsb-a3")["lr_per_256"] * 128 / 256)
    assert (seen["shape"], seen["layers"], seen["stall"], seen["calib"]) == ([3, 32, 32], 18, 60.0, "entropy")


def test_importing_the_configuration_reads_no_recipe_file():
    code = ("import builtins, sys\nopened = []\nreal_open = builtins.open\n"
            "def spying_open(file, *args, **kwargs):\n"
            "    opened.append(str(file))\n"
            "    return real_open(file, *args, **kwargs)\n"
            "builtins.open = spying_open\n"
            "import pkgutil, importlib, rn50kit.config as home\n"
            "for info in pkgutil.iter_modules(home.__path__):\n"
            "    importlib.import_module(f'rn50kit.config.{info.name}')\n"
            "print([path for path in opened if path.endswith('.toml')])\n")
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=venv_env(), capture_output=True, text=True,
                            timeout=HANG_S)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == "[]"


@pytest.fixture()
def recipes_with_a_broken_one(tmp_path, monkeypatch):
    """A copy of the shipped recipes plus ``broken.toml`` (not TOML at its line 3), as the recipes folder."""
    folder = tmp_path / "recipes"
    shutil.copytree(recipe.RECIPES_DIR, folder)
    (folder / "broken.toml").write_text('optimizer = "sgd"\nnum_epochs = 3\nlr_per_256 = = 0.1\n')
    monkeypatch.setattr(recipe, "RECIPES_DIR", folder)
    recipe.load_recipe.cache_clear()
    yield folder
    recipe.load_recipe.cache_clear()


def test_a_malformed_recipe_is_one_line_when_it_is_used_and_harmless_otherwise(recipes_with_a_broken_one, capsys):
    assert "broken" in recipe.shipped_names() and "broken" not in recipe.shipped()
    args = train_flags.parse_args(["--recipe", "he"])  # the other recipes (and --help's texts) are unaffected
    assert args.optimizer == "nag"
    with pytest.raises(SystemExit) as ended:
        train_flags.parse_args(["--recipe", "broken"], prog="train.py")
    assert ended.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("train.py: error: ") and "Traceback" not in err
    assert "broken.toml line 3, column" in err and "not valid TOML" in err


def test_a_malformed_default_recipe_refuses_every_run_in_one_line(recipes_with_a_broken_one, capsys):
    (recipes_with_a_broken_one / "nvidia.toml").write_text("optimizer = [\n")
    with pytest.raises(SystemExit) as ended:
        train_flags.check([])
    assert ended.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "nvidia.toml" in err and "not valid TOML" in err


@pytest.mark.parametrize("argv", [["--num-epochs", "0"], ["--optimizer", "sgd", "--opt-betas", "0.9,0.99"],
                                  ["--optimizer", "lamb", "--opt-betas", "0.9,1.5"], ["--opt-eps", "-1"],
                                  ["--no-such-flag"], ["--ema-decay", "1.5", "--lr", "0.1"], ["--dtype", "float8"]])
def test_the_in_process_check_refuses_as_train_py_does(argv, capsys):
    """runner's first check of the flags alone (train_flags.check) against its check of the launch, which completes
    the RunConfig as each worker's train.py does (start_checks.check_launch, through training.configure): the
    same line, the same status."""
    from rn50kit.training import start_checks
    launch = {"gpus": 0, "workers": 1, "workers_here": 1, "memory": False}
    outcomes = []
    on_any_machine = ["--data-backend", "synthetic"]
    for check in (train_flags.check, lambda argv: start_checks.check_launch(argv + on_any_machine, launch)):
        with pytest.raises(SystemExit) as ended:
            check(argv)
        outcomes.append((ended.value.code, capsys.readouterr().err))
    assert outcomes[0] == outcomes[1]
    code, err = outcomes[0]
    assert code == 2 and err.count("\n") == 1 and err.startswith("train.py: error: ")


def test_a_config_file_s_bad_value_is_blamed_on_the_file(tmp_path, capsys):
    path = tmp_path / "run.toml"
    path.write_text("[optimizer]\nopt_eps = 1e-8\n")  # the default recipe's optimizer: sgd
    with pytest.raises(SystemExit):
        train_flags.check(["--config", str(path)])
    err = capsys.readouterr().err
    assert "--opt-eps: --optimizer sgd has no eps" in err and f"(set by opt_eps in {path} line 2)" in err


def test_good_flags_pass_the_check():
    train_flags.check(["--recipe", "mlperf", "--batch-size", "256", "--opt-eps", "1e-9"])  # lars reads eps
    assert train_flags.problem(["--optimizer", "lamb", "--opt-betas", "0.8,0.9", "--opt-eps", "1e-7"]) is None


def test_fit_config_defaults_are_the_default_recipe_s():
    """FitConfig writes nvidia's values (nothing is read at import): they must be the file's."""
    defaults = cli.config_defaults(FitConfig)
    fields = {field.name for field in dataclasses.fields(FitConfig)}
    from_file = {key: value for key, value in recipe.recipe_defaults(recipe.DEFAULT_RECIPE).items() if key in fields}
    assert from_file and {key: defaults[key] for key in from_file} == from_file
