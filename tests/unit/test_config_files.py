"""Configuration as files, in-process: the shipped recipe files (read here with tomllib on their own, and against the
recipe table of docs/training.md), a user's recipe file, --config's precedence (defaults < recipe < file < command
line), and runner's plan against the RunConfig its worker builds from the same file."""
import dataclasses
import re

import pytest

import train
from rn50kit.config import config_files, resolved_config, train_config
from rn50kit.config import recipe as recipes
from rn50kit.config.cli import UsageError
from rn50kit.launch import arguments, train_flags
from rn50kit.launch.machine import Machine
from rn50kit.launch.plan import plan_launch
from rn50kit.training import run_record, state
from support.processes import ROOT

tomllib = config_files.tomllib  # the standard library's from Python 3.11 on, tomli on 3.10


def write(path, text):
    path.write_text(text)
    return str(path)


def test_each_shipped_recipe_is_its_file_with_source_and_result():
    files = sorted(recipes.RECIPES_DIR.glob("*.toml"))
    assert sorted(p.stem for p in files) == sorted(recipes.RECIPES)
    for path in files:
        with open(path, "rb") as f:
            raw = tomllib.load(f)
        points = raw.pop("lr_points", None)
        expected = dict(raw, **({"lr_points": {int(b): lr for b, lr in points.items()}} if points else {}))
        expected.setdefault("lr_steps", [])
        assert recipes.RECIPES[path.stem] == expected, path.name
        comment = path.read_text().split("\n\n")[0]
        assert comment.startswith(f"# {path.stem}: ") and "Published" in comment, path.name


def readme_recipe_rows():
    """{recipe: [its cells]} of the recipe table in docs/training.md."""
    text = open(f"{ROOT}/docs/training.md").read()
    table = text[text.index("| recipe | optimizer |"):].split("\n\n")[0].splitlines()[2:]
    return {re.match(r"`([^`]+)`", cells[0]).group(1): cells
            for cells in ([c.strip() for c in row.strip("|").split("|")] for row in table)}


def test_the_docs_recipe_table_agrees_with_the_files():
    rows = readme_recipe_rows()
    assert sorted(rows) == sorted(recipes.RECIPES)
    optimizers = {"sgd": "SGD", "nag": "Nesterov", "lars": "LARS", "lamb": "LAMB"}
    for name, (_, optimizer, lr, schedule, warmup, wd, smoothing, epochs) in rows.items():
        recipe = recipes.RECIPES[name]
        assert optimizer.startswith(optimizers[recipe["optimizer"]]), name
        if "lr_points" in recipe:
            assert lr.startswith("by global batch"), name
        else:
            assert float(lr.split()[0]) == recipe["lr_per_256"], name
        assert schedule.split()[0].split(",")[0] == recipe["lr_schedule"], name
        assert float(warmup) == recipe["warmup_epochs"], name
        numerator, _, denominator = wd.partition("/")
        assert float(numerator) / float(denominator or 1) == pytest.approx(recipe["wd"], rel=1e-12), name
        assert float(smoothing.split()[0]) == recipe["label_smoothing"], name
        assert int(re.match(r"\d+", epochs).group()) == recipe["num_epochs"], name


def test_a_users_recipe_file_gives_the_defaults(tmp_path):
    path = write(tmp_path / "mine.toml", '# mine\noptimizer = "nag"\nmom = 0.7\nlr_per_256 = 0.5\nnum_epochs = 12\n'
                 'lr_schedule = "step"\nlr_steps = [4, 8]\n')
    args = train.parse_args(["--recipe", path, "--batch-size", "128"])
    notes = train.fill_hyper_parameters(args)
    assert (args.optimizer, args.mom, args.num_epochs, args.lr_steps) == ("nag", 0.7, 12, [4, 8])
    assert args.lr == pytest.approx(0.5 * 128 / 256) and args.recipe == path and "0.5 x 128/256" in notes[0]
    assert args.wd == train.parse_args([]).wd  # a key the recipe leaves out keeps the parser's default


@pytest.mark.parametrize("text, says", [
    ('lr_per_256 = 0.1\nnum_epochs = 3\nmomentum = 0.9\n', "line 3: unknown key 'momentum'"),
    ('lr_per_256 = 0.1\nnum_epochs = 3\nmom = "high"\n', 'line 3: mom = "high": expected a number (--mom)'),
    ('lr_per_256 = 0.1\n', "a recipe needs num_epochs = N"),
    ('num_epochs = 3\n', "lr_per_256 = X"),
    ('num_epochs = 3\n[lr_points]\n1632 = 7.4\nbig = 9.0\n', "line 4: [lr_points] big = 9.0: [lr_points] maps"),
    ('num_epochs = 3\n[lr_points]\n# the LR at 1632\n1632 = "7.4"\n', 'line 4: [lr_points] 1632 = "7.4": '),
    ('num_epochs = 3\n[lr_points]\n1632 = true\n', "line 3: [lr_points] 1632 = true: "),
    ('num_epochs = 3\n[lr_points]\n0 = 0.1\n', "line 3: [lr_points] 0 = 0.1: "),
    ('num_epochs = 3\nlr_points = 5\n', "line 2: [lr_points] maps global batches to LRs"),
    ('num_epochs = 3\n\n[lr_points]\n', "line 3: [lr_points] maps global batches to LRs"),
])
def test_a_bad_recipe_file_is_one_line(tmp_path, capsys, text, says):
    path = write(tmp_path / "bad.toml", text)
    with pytest.raises(SystemExit) as exit_:
        train.parse_args(["--recipe", path])
    error = capsys.readouterr().err.strip()
    assert exit_.value.code == 2 and says in error and "\n" not in error and str(tmp_path) in error


def test_precedence_defaults_recipe_file_command_line(tmp_path):
    """The recipe's values over the defaults, the file's over the recipe's, the command line's over all: even a
    flag typed with the value it would have anyway."""
    path = write(tmp_path / "run.toml", 'recipe = "he"\n[optimizer]\nmom = 0.8\nwd = 2e-4\n'
                                        '[model]\nnum-layers = 34\n')
    args = train.parse_args(["--config", path, "--wd", "0.0001"])
    assert args.optimizer == "nag" and args.lr_schedule == "step"  # recipe he over the defaults
    assert args.mom == 0.8 and args.num_layers == 34  # the file over the recipe and the defaults
    assert args.wd == 1e-4  # typed, equal to he's own value, still over the file's
    assert train.parse_args(["--config", path, "--recipe", "nvidia"]).optimizer == "sgd"  # typed recipe wins
    assert {"mom", "wd", "num_layers", "recipe"} <= train.given_flags(["--config", path])


def test_a_switch_is_its_destination_or_its_flag(tmp_path):
    assert train.parse_args(["--config", write(tmp_path / "a.toml", "zero_init_last_gamma = false\n")]) \
        .zero_init_last_gamma is False
    args = train.parse_args(["--config", write(tmp_path / "b.toml", "[model]\nno-zero-init-last-gamma = true\n"
                                                                     "[run]\nfp16_allreduce = true\n")])
    assert args.zero_init_last_gamma is False and args.fp16_allreduce is True
    assert train.parse_args(["--config", str(tmp_path / "b.toml"), "--dtype", "float32"]).zero_init_last_gamma is False


def test_one_rule_for_types_numbers_or_their_text_and_true_false_for_yes_or_no(tmp_path):
    """Issue 58: batch_size = "32" was taken while random_mirror = false was refused."""
    text = 'batch_size = "32"\nrandom_mirror = false\nfuse_bn_relu = true\n'
    args = train.parse_args(["--config", write(tmp_path / "a.toml", text)])
    assert (args.batch_size, args.random_mirror, args.fuse_bn_relu) == (32, 0, 1)
    assert train.parse_args(["--config", write(tmp_path / "b.toml", "random_mirror = 1\n")]).random_mirror == 1


def worker_config(train_argv, num_gpus):
    """The RunConfig a worker builds from its command line (train.run's steps before any device is touched)."""
    args = train.parse_args(train_argv)
    return train.configure(args, train.given_flags(train_argv), num_gpus)


@pytest.mark.parametrize("machine, text", [
    (Machine(0, 4), 'ngpus = 2\nbatch_size = 48\ndtype = "float32"\nmode = "train"\n'),
    (Machine(8, 64), '[runner]\nngpus = 4\n[fit]\nbatch_size = 256\ndtype = "float16"\nmode = "train"\n'
                              'kv_store = "horovod"\n'),
    (Machine(8, 64), 'ngpus = 2\nbatch_size = 64\ndtype = "float16"\nmode = "train"\nkv_store = "device"\n'
                              'gpus = "2,3"\n'),
])
def test_runners_plan_and_the_workers_config_agree(tmp_path, machine, text):
    workspace = tmp_path / "ws"
    path = write(tmp_path / "run.toml", f'data_backend = "synthetic"\nworkspace = "{workspace}"\n' + text)
    args, env, command = plan_launch(["--config", path], machine, {})
    planned = arguments.peek_extra(train_flags.train_arguments(command), args.file_values)
    cfg = worker_config(train_flags.train_arguments(command), machine.gpus)
    written = tomllib.loads(open(path).read())
    flat = {**written, **written.get("fit", {}), **written.get("runner", {})}
    assert args.ngpus == flat["ngpus"] and args.batch_size * args.ngpus == cfg.fit.batch_size == flat["batch_size"]
    assert args.dtype == cfg.fit.dtype == flat["dtype"] and args.kv_store == cfg.fit.kv_store
    assert planned.mode == cfg.fit.mode == "train" and planned.workspace == cfg.fit.workspace == str(workspace)
    assert args.data_backend == cfg.data.data_backend == "synthetic"
    if args.kv_store == "horovod":
        assert command[command.index("-np") + 1] == str(flat["ngpus"])
    else:  # one process drives the file's GPUs
        assert planned.gpus == cfg.fit.gpus == "2,3" and env["CUDA_VISIBLE_DEVICES"] == "2,3"
    # The command line wins for runner and workers alike.
    gpus = ["--gpus", "5"] if "gpus" in flat else []
    args, env, command = plan_launch(["--config", path, "-n", "1", "-b", "16", "--mode", "train_val", *gpus],
                                     machine, {})
    cfg = worker_config(train_flags.train_arguments(command), machine.gpus)
    assert (args.ngpus, cfg.fit.batch_size, cfg.fit.mode) == (1, 16, "train_val")
    if gpus:
        assert cfg.fit.gpus == "5" and env["CUDA_VISIBLE_DEVICES"] == "5"
    assert arguments.peek_extra(train_flags.train_arguments(command), args.file_values).mode == "train_val"


def test_a_global_batch_that_does_not_divide_is_refused(tmp_path):
    path = write(tmp_path / "run.toml", 'batch_size = 50\nngpus = 4\ndata_backend = "synthetic"\n')
    with pytest.raises(UsageError, match=r"batch_size = 50 in .*run.toml is the global batch"):
        plan_launch(["--config", path], Machine(0, 4), {})


def test_the_resolved_tables_read_back_as_the_same_run_config(tmp_path):
    """Every field of a RunConfig written by write_resolved and read back through --config (train.py's reader)."""
    cfg = train_config.RunConfig().replace(fit__seed=5, fit__lr=0.3, fit__lr_steps=(3.0, 6.5), fit__dtype="float32",
                                           data__image_shape=(4, 32, 32), data__color_jitter=(0.1, 0.2, 0.3),
                                           fit__fp16_allreduce=True, model__num_layers=34)
    info = state.RunInfo(model_name="x", arch="y", command=[], report_path="r", record={}, report_info={})
    path = config_files.write_resolved(tmp_path / "config.toml", run_record.resolved_tables(cfg, info, 2))
    read = train_config.from_args(train.parse_args(["--config", str(path)]))
    for concern in train_config.CONFIGS:
        for field in dataclasses.fields(getattr(cfg, concern)):
            assert getattr(getattr(read, concern), field.name) == getattr(getattr(cfg, concern), field.name) or \
                field.name == "config", f"{concern}.{field.name}"
    assert not list(tmp_path.glob("*.tmp-*"))  # written through a temporary file, renamed


def test_the_readme_recipe_table_names_every_recipe_with_its_epochs():
    text = open(f"{ROOT}/README.md").read()
    table = text[text.index("| recipe | epochs |"):].split("\n\n")[0].splitlines()[2:]
    rows = {re.match(r"`([^`]+)`", cells[0]).group(1): int(cells[1])
            for cells in ([c.strip() for c in row.strip("|").split("|")] for row in table)}
    assert rows == {name: recipe["num_epochs"] for name, recipe in recipes.RECIPES.items()}


def test_the_resolved_config_holds_absolute_paths_and_replays_from_another_directory(tmp_path, monkeypatch):
    """Paths from the current directory come back absolute from anywhere; those inside the workspace as given."""
    monkeypatch.chdir(tmp_path)
    cfg = train_config.RunConfig().replace(data__data_train="data/train.rec", data__data_val="data/val.rec",
                                           fit__workspace="runs/x", fit__load="runs/x/model-0003.params",
                                           fit__model_prefix="ckpt/model", fit__report="r.json",
                                           finetune__pretrained="weights/r50.safetensors",
                                           predict__data_pred="photos/*.jpg", predict__pred_out="out.csv")
    info = state.RunInfo(model_name="x", arch="y", command=[], report_path="r", record={}, report_info={})
    path = config_files.write_resolved(tmp_path / "config.toml", run_record.resolved_tables(cfg, info, 1))
    (tmp_path / "other").mkdir()
    monkeypatch.chdir(tmp_path / "other")
    read = train_config.from_args(train.parse_args(["--config", str(path)]))
    absolute = {(concern, name) for concern, names in resolved_config.FROM_CURRENT_DIRECTORY.items()
                for name in names}
    for concern in train_config.CONFIGS:
        for field in dataclasses.fields(getattr(cfg, concern)):
            given = getattr(getattr(cfg, concern), field.name)
            expected = str(tmp_path / given) if (concern, field.name) in absolute and given else given
            assert getattr(getattr(read, concern), field.name) == expected or field.name == "config", field.name
    assert read.predict.data_pred == f"{tmp_path}/photos/*.jpg" and read.fit.model_prefix == "ckpt/model"


def test_a_recipe_file_a_config_file_names_is_found_beside_it(tmp_path, monkeypatch):
    """recipe = "mine.toml" in a config file: from the file's folder, wherever the command runs."""
    (tmp_path / "cfg").mkdir()
    write(tmp_path / "cfg" / "mine.toml", 'optimizer = "nag"\nlr_per_256 = 0.5\nnum_epochs = 12\n')
    path = write(tmp_path / "cfg" / "run.toml", 'recipe = "mine.toml"\n')
    monkeypatch.chdir(tmp_path)
    args = train.parse_args(["--config", path])
    assert args.recipe == str(tmp_path / "cfg" / "mine.toml") and args.optimizer == "nag"


@pytest.mark.parametrize("text, says", [
    ("mom = 0.9\n[optimizer]\nmom = 0.8\n", "line 3: 'mom' is set twice (also at the top level); keep one"),
    ("[optimizer]\nmom = 0.9\n[fit]\nmom = 0.8\n", "line 4: 'mom' is set twice (also in [optimizer]); keep one"),
    ('lr_steps = [1, "a"]\n', 'line 1: lr_steps = [1, "a"]: expected a value --lr-steps accepts'),
])
def test_a_bad_config_file_says_it_as_the_file_wrote_it(tmp_path, capsys, text, says):
    path = write(tmp_path / "run.toml", text)
    with pytest.raises(SystemExit):
        train.parse_args(["--config", path])
    error = capsys.readouterr().err.strip()
    assert f"{path} {says}" in error and "\n" not in error


def test_runners_refusal_of_a_value_from_the_file_names_the_file(tmp_path):
    path = write(tmp_path / "run.toml", 'data_backend = "synthetic"\nngpus = 0\n')
    with pytest.raises(UsageError) as refused:
        plan_launch(["--config", path], Machine(0, 4), {})
    assert arguments.blame_config_file(str(refused.value), ["--config", path]).endswith(
        f"(set by ngpus in {path} line 2)")
    with pytest.raises(UsageError) as refused:
        plan_launch(["--config", path, "--ngpus", "0"], Machine(0, 4), {})
    assert "set by" not in arguments.blame_config_file(str(refused.value), ["--config", path, "--ngpus", "0"])
