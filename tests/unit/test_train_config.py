"""The configs: every flag of train.py lands in exactly one field of one concern's config and is read somewhere,
each config builds without the parser from its own defaults, and the recipes fill what was not typed."""
import ast
import dataclasses
import glob
import math
import os

import pytest

import train
from rn50kit.config import cli, fit_flags, train_config
from rn50kit.config import recipe as recipes
from rn50kit.data import loaders
from support.processes import ROOT


def parser_dests():
    return {action.dest for action in train.get_args_parser()._actions if action.dest != "help"}


def test_every_flag_is_a_field_of_exactly_one_config():
    owners = {}
    for concern, cls in train_config.CONFIGS.items():
        for field in dataclasses.fields(cls):
            owners.setdefault(field.name, []).append(concern)
    shared = {name: concerns for name, concerns in owners.items() if len(concerns) > 1}
    assert not shared, f"fields in more than one config: {shared}"
    dests = parser_dests()
    assert sorted(dests - set(owners)) == [], "flags no config holds"
    assert sorted(set(owners) - dests) == [], "config fields no flag sets"


def test_each_config_builds_without_the_parser_and_is_frozen():
    cfg = train_config.RunConfig()
    assert cfg.model.name == "resnet50_v1.5" and cfg.fit.batch_size == 192 and cfg.data.image_shape == (3, 224, 224)
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.fit.lr = 1.0
    changed = cfg.replace(fit__seed=7, data__data_val=None, model__num_classes=10)
    assert (changed.fit.seed, changed.model.num_classes) == (7, 10) and cfg.fit.seed is None
    feed = loaders.feed_of(changed)
    assert (feed.batch_size, feed.seed, feed.num_classes) == (192, 7, 10)


@pytest.mark.parametrize("recipe", sorted(recipes.RECIPES))
def test_parsed_defaults_equal_the_config_defaults_and_the_recipe(recipe):
    """No flag given: the parser's values are the configs' defaults, except what the recipe sets."""
    parsed = train_config.from_args(train.parse_args(["--recipe", recipe]))
    recipe_values = recipes.recipe_defaults(recipe)
    for concern, cls in train_config.CONFIGS.items():
        default, got = getattr(train_config.RunConfig(), concern), getattr(parsed, concern)
        for field in dataclasses.fields(cls):
            expected = recipe_values.get(field.name, getattr(default, field.name))
            expected = tuple(expected) if isinstance(expected, list) else expected
            if field.name == "recipe":
                expected = recipe
            assert getattr(got, field.name) == expected, f"{concern}.{field.name}"


def test_a_typed_flag_lands_in_its_config():
    cfg = train_config.from_args(train.parse_args(["--num-layers", "18", "--image-shape", "4,32,32", "--lr", "0.3",
                                             "--calib-mode", "entropy", "--data-pred", "x.jpg"]))
    assert cfg.model.num_layers == 18 and cfg.data.image_shape == (4, 32, 32) and cfg.fit.lr == 0.3
    assert cfg.quantize.calib_mode == "entropy" and cfg.predict.data_pred == "x.jpg"
    assert train_config.owner("lr") == "fit" and train_config.owner("rgb_mean") == "data"
    assert train_config.owner("nope") is None


def test_fit_check_names_the_flag():
    with pytest.raises(ValueError, match="--ema-decay"):
        fit_flags.check(fit_flags.FitConfig(num_epochs=2, ema_decay=1.5))
    fit_flags.check(fit_flags.FitConfig(num_epochs=2))


def test_recipe_gives_the_defaults_and_the_command_line_wins():
    import train
    args = train.parse_args(["--recipe", "he", "--batch-size", "512", "--mom", "0.8"])
    train.fill_hyper_parameters(args)
    assert args.optimizer == "nag" and args.mom == 0.8 and args.lr == pytest.approx(0.2)
    assert args.lr_steps == [30, 60, 80] and args.wd == 1e-4 and args.num_epochs == 90
    args = train.parse_args(["--recipe", "nvidia-2019", "--lr", "0.3"])
    train.fill_hyper_parameters(args)
    assert args.lr == 0.3 and args.min_random_area == 0.05 and args.lr_schedule == "step"
    # A flag typed with the value the parser would default to still wins over the recipe (apply_recipe, before,
    # took a value equal to the parser default for unset: this trained with 0.05).
    args = train.parse_args(["--recipe", "nvidia-2019", "--min-random-area", "0.08", "--mom", "0.875"])
    assert args.min_random_area == 0.08 and args.mom == 0.875 and args.wd == 1e-4
    args = train.parse_args(["--rec", "he"])  # an abbreviation, as argparse accepts for every flag
    assert args.recipe == "he" and args.optimizer == "nag"
    args = train.parse_args([])
    train.fill_hyper_parameters(args)
    assert args.lr == pytest.approx(0.256 * 192 / 256) and args.mom == 0.875 and args.wd == 1 / 32768
    assert args.label_smoothing == 0.1 and args.lr_schedule == "cosine" and math.isclose(args.warmup_epochs, 5)


def kit_sources():
    """The kit's Python files (tests and tools' own parsers aside), without their add_*_args functions."""
    paths = (glob.glob(os.path.join(ROOT, "*.py"))
             + glob.glob(os.path.join(ROOT, "rn50kit", "**", "*.py"), recursive=True)
             + glob.glob(os.path.join(ROOT, "tools", "*.py")))
    code = []
    for path in paths:
        tree = ast.parse(open(path).read())
        tree.body = [node for node in tree.body if not (isinstance(node, ast.FunctionDef) and
                                                        node.name.startswith("add_") and node.name.endswith("_args"))]
        code.append(tree)
    return code


def names_read(trees):
    """Attribute names read anywhere (args.x), and string constants (getattr(args, "x"), f"data_{split}" aside)."""
    attributes, strings = set(), set()
    for tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute):
                attributes.add(node.attr)
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                strings.add(node.value)
    return attributes, strings


def test_every_registered_flag_is_read_somewhere():
    attributes, strings = names_read(kit_sources())
    dests = {action.dest for action in train.get_args_parser()._actions if action.dest != "help"}
    unread = sorted(d for d in dests if d not in attributes and d not in strings)
    assert not unread, f"flags registered but never read: {unread}"


def test_mlperf_recipe_sets_the_issue_table_and_its_lr_follows_the_effective_batch():
    args = train.parse_args(["--recipe", "mlperf", "--batch-size", "816", "--grad-accum-steps", "2"])
    how = " ".join(train.fill_hyper_parameters(args))
    cfg = train_config.from_args(args)
    f, d = cfg.fit, cfg.data
    assert (f.optimizer, f.lars_eta, f.lars_eps, f.mom, f.wd) == ("lars", 0.001, 0.0, 0.9, 5e-5)
    assert (f.lr_schedule, f.lr_power, f.lr_end, f.warmup_epochs, f.num_epochs) == ("poly", 2.0, 1e-4, 2.0, 37)
    assert (f.label_smoothing, f.mixup, d.min_random_area, d.max_random_area) == (0.1, 0.0, 0.05, 1.0)
    assert (d.min_random_aspect_ratio, d.max_random_aspect_ratio, d.data_val_resize) == (0.75, 4 / 3, 256)
    assert (f.eval_every, f.eval_offset, d.random_mirror) == (4, 2, 1)
    assert f.lr == 7.4 and "1632" in how  # 816 x 2 accumulated = the 1,632 point
    given = train.parse_args(["--recipe", "mlperf", "--lr", "3", "--optimizer", "sgd"])
    assert train.fill_hyper_parameters(given) == [] and (given.lr, given.optimizer) == (3.0, "sgd")


def notes_lr(recipe):
    """fill_hyper_parameters' note on the recipe's LR for the default batch (no --lr typed)."""
    return recipes.recipe_lr_source(recipe, 192)[1]


@pytest.mark.parametrize("recipe", ["he", "nvidia-2019"])
def test_a_recipes_steps_are_scaled_to_a_shorter_run_unless_typed(recipe):
    """Found by the second newcomer walk (issue 26)."""
    from rn50kit.config import settings
    argv = ["--recipe", recipe, "--num-epochs", "30"]
    args = train.parse_args(argv)
    note = " ".join(train.fill_hyper_parameters(args, settings.given_flags(train.get_args_parser(), argv)))
    assert args.lr_steps == [10, 20, 26.67] and "scaled to this run's 30" in note
    train.check_config(train_config.from_args(args))  # no longer refused
    typed = argv + ["--lr-steps", "30,60,80"]
    args = train.parse_args(typed)
    assert train.fill_hyper_parameters(args, settings.given_flags(train.get_args_parser(), typed)) == [notes_lr(recipe)]
    with pytest.raises(cli.UsageError, match="lie at or beyond the last epoch"):  # typed: the user's, refused
        train.check_config(train_config.from_args(args))
    args = train.parse_args(["--recipe", recipe])  # the recipe's own length: its own steps
    assert train.fill_hyper_parameters(args) == [notes_lr(recipe)] and args.lr_steps == [30, 60, 80]
