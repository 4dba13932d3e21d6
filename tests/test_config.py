"""The configs: every flag of train.py lands in exactly one field of one concern's config, each config is built
without a parser from its own defaults, and those defaults are the flags' defaults."""
import dataclasses

import pytest

from rn50kit.config import train_config
from rn50kit.data import loaders
from rn50kit.training import fit_flags
from rn50kit.common import schedules
import train


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


@pytest.mark.parametrize("recipe", sorted(schedules.RECIPES))
def test_parsed_defaults_equal_the_config_defaults_and_the_recipe(recipe):
    """No flag given: the parser's values are the configs' defaults, except what the recipe sets."""
    parsed = train_config.from_args(train.parse_args(["--recipe", recipe]))
    recipe_values = schedules.recipe_defaults(recipe)
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
    assert train_config.owner("lr") == "fit" and train_config.owner("rgb_mean") == "data" and train_config.owner("nope") is None


def test_fit_check_names_the_flag():
    with pytest.raises(ValueError, match="--ema-decay"):
        fit_flags.check(fit_flags.FitConfig(num_epochs=2, ema_decay=1.5))
    fit_flags.check(fit_flags.FitConfig(num_epochs=2))
