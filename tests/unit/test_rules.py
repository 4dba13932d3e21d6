"""One table of data backends and one set of run rules, used by runner and train.py alike: the same refusal, word
for word, from both sides of the MXNet wall; one LR-scaling rule; the schedules as small named functions."""
import math

import mxnet as mx
import pytest

import train
from rn50kit.common import backends, rules
from rn50kit.config import cli, data_flags, lr_schedules
from rn50kit.config import recipe as recipes
from rn50kit.launch.machine import Machine
from rn50kit.launch.plan import plan_launch
from support.runs import TINY_RUN, plan_refusal, train_refusal


def runner_refusal(argv, gpus=0, cores=2):
    with pytest.raises(cli.UsageError) as error:
        plan_launch(["--data-backend", "synthetic", *argv], Machine(gpus, cores), {})
    return str(error.value)


@pytest.mark.parametrize("argv, rule", [
    (["--dtype", "float16"], lambda: rules.dtype_problem("float16", "train_val", gpu=False)),
    (["--dtype", "int8"], lambda: rules.dtype_problem("int8", "train_val", gpu=False)),
])
def test_runner_and_train_refuse_with_the_same_line(argv, rule):
    """`./runner --dtype float16` on a CPU machine was refused, `python train.py --dtype float16` was not."""
    argv = [a for a in argv]
    tiny = [a for a in TINY_RUN if a not in ("--dtype", "float32")]  # the flag under test replaces TINY's
    expected = rule()
    assert expected and runner_refusal(argv) == expected
    args = train.parse_args(["--kv-store", "local", *tiny, *argv])
    with pytest.raises(cli.UsageError) as error:
        train.main(args)
    assert str(error.value) == expected


def test_a_gpu_backend_is_refused_alike_without_a_gpu():
    assert mx.context.num_gpus() == 0  # this test is about a CPU machine
    expected = rules.backend_problem("dali-gpu", gpu=False)
    with pytest.raises(cli.UsageError) as error:
        plan_launch(["--data-backend", "dali-gpu", "--dtype", "float32"], Machine(0, 2), {})
    assert str(error.value) == expected
    args = train.parse_args(["--kv-store", "local", "--dtype", "float32", "--data-backend", "dali-gpu",
                             "--data-train", __file__, "--data-train-idx", __file__, "--num-layers", "18"])
    with pytest.raises(cli.UsageError) as error:
        train.main(args)
    assert str(error.value) == expected


def test_the_backends_table_is_the_one_list():
    assert cli.DATA_BACKENDS == list(backends.BACKENDS)
    for name in backends.NAMES:
        build = backends.builder(name)
        assert callable(build) and build.__module__.startswith("rn50kit.data.backend_")
    assert [name for name in backends.NAMES if backends.needs_gpu(name)] == ["dali-gpu"]
    assert [name for name in backends.NAMES if not backends.reads_records(name)] == ["synthetic"]
    assert backends.default(gpu=True) == "dali-gpu" and backends.default(gpu=False) == "dali-cpu"
    with pytest.raises(ValueError, match="choose from"):
        backends.get("opencv")
    # every backend's own flags exist in train.py's parser
    dests = {action.dest for action in train.get_args_parser()._actions}
    for backend in backends.BACKENDS.values():
        if backend.flag_prefix:
            assert any(d.startswith(backend.flag_prefix) for d in dests), backend.name


def test_one_lr_scaling_rule_for_runner_and_the_recipes(tmp_path):
    """runner's -l (per 256 images) and a recipe's LR per 256 become the same absolute LR for a global batch."""
    _, _, command = plan_launch(["-n", "2", "-b", "48", "-l", "0.256", "--data-backend", "synthetic",
                                 "--dtype", "float32"], Machine(0, 2), {})
    planned = float(command[command.index("--lr") + 1])
    assert planned == pytest.approx(0.256 * 96 / 256)
    assert recipes.recipe_lr("nvidia", 96) == pytest.approx(planned)  # the nvidia recipe: 0.256 per 256


def test_schedules_are_named_functions_checked_against_their_formulas():
    base, final = 0.8, 0.01
    expected = {"cosine": final + (base - final) * 0.5 * (1 + math.cos(math.pi * 0.25)),
                "linear": final + (base - final) * 0.75, "poly": final + (base - final) * 0.75 ** 2,
                "step": base * 0.1}  # epoch 4 of 10 after 2 warmup epochs; steps at 3 and 8
    assert set(expected) == set(lr_schedules.SCHEDULES)
    for kind, value in expected.items():
        lr = lr_schedules.get_schedule(kind, base, 10, warmup_epochs=2, steps=[8, 3], factor=0.1, power=2,
                                    final_lr=final)
        assert lr(1.0) == pytest.approx(base / 2), kind  # halfway through the warmup
        assert lr(4.0) == pytest.approx(value), kind


def test_the_data_check_leaves_the_gpu_rule_to_rules():
    """check_data_files names missing files only (the rule about GPUs is worded once, in rules.py)."""
    cfg = data_flags.DataConfig(data_backend="dali-gpu", data_train="/nonexistent.rec",
                                data_train_idx="/nonexistent.idx")
    assert "does not exist" in data_flags.check_data_files(cfg)


@pytest.mark.parametrize("argv, expected", [
    (["--dtype", "float16"], "--dtype float16 needs a GPU and this machine has none"),
    (["--conv-layout", "NHWC"], "--conv-layout NHWC needs a GPU (cuDNN) and this machine has none"),
    (["--gpus", "0,1", "--kv-store", "device"], "--gpus 0,1 names GPUs and this machine has none"),
])
def test_what_a_cpu_cannot_run_is_refused_alike_by_runner_and_train(argv, expected):
    """Found by the second newcomer walk (issue 26)."""
    import mxnet as mx
    assert mx.context.num_gpus() == 0  # about a CPU machine
    by_train = train_refusal(*[a for a in argv if a != "float32"])
    assert by_train.startswith(expected) and "\n" not in by_train
    assert plan_refusal(*argv) == by_train
    runner_refusal_on_gpus = None
    try:
        workers = ["-n", "2"] if "--gpus" in argv else []  # -n agrees with --gpus (devices.select_gpus)
        plan_launch(["--data-backend", "synthetic", *workers, *argv], Machine(8, 64), {})
    except cli.UsageError as error:
        runner_refusal_on_gpus = str(error)
    assert runner_refusal_on_gpus is None  # each runs on GPUs
