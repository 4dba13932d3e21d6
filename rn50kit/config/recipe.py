"""Training recipes: named hyper-parameter presets, one TOML file each in rn50kit/config/recipes/.

A recipe gives the parser its defaults: a config file's values and a flag on the command line win. `--lr` is the
absolute learning rate for the global batch (runner passes it already scaled); when it is not given, the recipe's
LR per 256 images is scaled linearly: lr = lr_per_256 * batch_size / 256, or, for a recipe with LR points
(mlperf), the nearest point's LR scaled by the square root of the batch ratio (points_lr).
The batch is the effective global batch: --batch-size x --grad-accum-steps.

Nothing is read at import: a recipe's file is read (once, cached) when that recipe is used, so one malformed file
is a one-line ConfigError for the runs that use it, not a traceback for every command. The help texts list the
recipes that read; a malformed one is left out of them, and refused when chosen.
"""
import argparse
import math
import os
from functools import lru_cache
from pathlib import Path

from rn50kit.config import config_files
from rn50kit.config.config_files import ConfigError

# One TOML file per recipe, shipped in the package (setup.py's package_data): its source and published result are
# comments at its top. A user's recipe is a file of the same form, given as --recipe PATH.toml.
RECIPES_DIR = Path(__file__).resolve().parent / "recipes"
DEFAULT_RECIPE = "nvidia"
# Not parser defaults: the LR depends on the global batch, the epochs on --mode (scoring makes 1 pass).
DERIVED_FIELDS = ("lr_per_256", "lr_points", "num_epochs")


def is_recipe_file(text):
    return str(text).endswith(".toml") or os.sep in str(text)


def recipe_file(name):
    """The file of recipe ``name``: a shipped one's, or the user's .toml path itself."""
    return Path(name) if is_recipe_file(name) else RECIPES_DIR / f"{name}.toml"


# The order --help and the docs list the shipped recipes in (oldest first); a file added to RECIPES_DIR comes after.
LISTED_FIRST = ("nvidia", "nvidia-2019", "he", "mlperf", "finetune", "rsb-a3", "ffcv-24")


def shipped_names():
    """The shipped recipes' names, the default first."""
    names = {path.stem for path in RECIPES_DIR.glob("*.toml")}
    return [name for name in LISTED_FIRST if name in names] + sorted(names - set(LISTED_FIRST))


def positive_number(value):
    return isinstance(value, (int, float)) and not isinstance(value, bool) and 0 < value < math.inf


def read_lr_points(settings):
    """A recipe's [lr_points] table as {global batch: LR}; a ConfigError naming the line of a bad entry."""
    table = settings.values["lr_points"]
    example = "[lr_points] maps global batches to LRs, e.g. 1632 = 7.4"
    if not isinstance(table, dict) or not table:
        raise ConfigError(f"{settings.where('lr_points')}: {example}")
    points = {}
    for batch, lr in table.items():
        if not (batch.isdigit() and int(batch) > 0 and positive_number(lr)):
            line = settings.lines.get(("lr_points", config_files.dest_of(batch)))
            where = f"{settings.path} line {line}" if line else str(settings.path)
            raise ConfigError(f"{where}: [lr_points] {batch} = {config_files.show(lr)}: {example} (a positive "
                              "whole batch, a positive LR)")
        points[int(batch)] = float(lr)
    return points


@lru_cache(maxsize=None)
def load_recipe(name):
    """A recipe's fields (the flags' defaults, plus lr_per_256 or lr_points and num_epochs), read from its file;
    a ConfigError (one line) for an unknown name or a file that is not a recipe."""
    path = recipe_file(name)
    if not is_recipe_file(name) and not path.is_file():
        raise ConfigError(f"invalid choice: '{name}' (choose from {', '.join(shipped_names())}, or give a "
                          "recipe file PATH.toml)")
    settings = config_files.read(path, "--recipe")
    fields = dict(settings.values)
    if "lr_points" in fields:
        fields["lr_points"] = read_lr_points(settings)
    if ("lr_per_256" in fields) == ("lr_points" in fields):
        raise ConfigError(f"{path}: a recipe gives its LR as lr_per_256 = X (per 256 images) or as an "
                          "[lr_points] table (global batch = LR), one of the two")
    if "lr_per_256" in fields and not positive_number(fields["lr_per_256"]):
        raise ConfigError(f"{settings.where('lr_per_256')}: lr_per_256 = {fields['lr_per_256']!r}: expected a "
                          "positive number")
    epochs = fields.get("num_epochs")
    if not isinstance(epochs, int) or isinstance(epochs, bool) or epochs < 1:
        raise ConfigError(f"{settings.where('num_epochs')}: a recipe needs num_epochs = N (a positive integer), "
                          f"got {epochs!r}")
    fields.setdefault("lr_steps", [])
    return fields


def recipe_argument(text):
    """--recipe's type: a shipped recipe's name, or a recipe file (kept as its absolute path, so a run's record
    still finds it from another directory)."""
    try:
        load_recipe(text)
    except ConfigError as error:
        raise argparse.ArgumentTypeError(str(error))
    return os.path.abspath(text) if is_recipe_file(text) else text


def shipped():
    """The shipped recipes that read, by name ({name: fields}), the default first: for help texts and listings (a
    malformed file is left out here, and refused with its one line when it is chosen)."""
    fields = {}
    for name in shipped_names():
        try:
            fields[name] = load_recipe(name)
        except ConfigError:
            continue
    return fields


def __getattr__(name):
    """RECIPES, the shipped recipes by name (shipped()), read when first asked for, not at import."""
    if name == "RECIPES":
        return shipped()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def recipe(name):
    """The fields of recipe ``name``: a shipped one's name or a recipe file's path."""
    return load_recipe(name)


def recipe_defaults(name):
    """The parser defaults a recipe sets (command line > config file > recipe > parser defaults)."""
    try:
        fields = load_recipe(name)
    except ConfigError as error:
        raise ValueError(str(error))
    return {key: value for key, value in fields.items() if key not in DERIVED_FIELDS}


def scaled_lr(lr_per_256, batch_size):
    """The one LR-scaling rule (runner's -l and the recipes'): an LR per 256 images scaled linearly to the global
    batch (Goyal et al. 2017)."""
    return lr_per_256 * batch_size / 256


def points_lr(points, batch_size):
    """(LR, how it was found) for a global batch from {batch: LR} points: the point nearest in log(batch), its LR
    scaled by sqrt(batch / point's batch) (LARS's points follow the square root: 7.4 x sqrt(2) = 10.47 ~ 10.5
    at twice 1,632); a batch of a point takes that point's LR as it is."""
    point = min(points, key=lambda b: (abs(math.log(batch_size / b)), b))
    lr = points[point] * math.sqrt(batch_size / point)
    how = f"MLCommons' point {point} -> {points[point]:g}" + \
        ("" if point == batch_size else f", scaled by sqrt({batch_size}/{point})")
    return lr, how


def recipe_lr_source(name, batch_size):
    """(the recipe's LR for a global batch, a sentence on how it was found)."""
    recipe = load_recipe(name)
    if "lr_points" in recipe:
        lr, how = points_lr(recipe["lr_points"], batch_size)
        return lr, f"recipe {name}: LR {lr:g} for global batch {batch_size} ({how})"
    lr = scaled_lr(recipe["lr_per_256"], batch_size)
    return lr, f"recipe {name}: LR {lr:g} = {recipe['lr_per_256']:g} x {batch_size}/256"


def recipe_lr_help():
    """--lr's help: each recipe's LR rule."""
    parts = []
    for name, recipe in shipped().items():
        if "lr_points" in recipe:
            points = ", ".join(f"{b} -> {lr:g}" for b, lr in sorted(recipe["lr_points"].items()))
            parts.append(f"{name}: LARS points {points}, the nearest scaled by sqrt(batch / its batch)")
        else:
            parts.append(f"{name}: {recipe['lr_per_256']:g} per 256")
    return "; ".join(parts)


def recipe_lr(name, batch_size):
    """The recipe's LR for a global batch."""
    return recipe_lr_source(name, batch_size)[0]


def recipe_epochs(name):
    return load_recipe(name)["num_epochs"]


def steps_for_length(name, num_epochs):
    """A recipe's --lr-steps for a run of ``num_epochs`` instead of its own length: the same fractions of the run
    (30/60/80 of 90 epochs are 10/20/26.67 of 30), rounded to hundredths of an epoch."""
    return [round(s * num_epochs / recipe_epochs(name), 2) for s in load_recipe(name)["lr_steps"]]


def recipe_help(name):
    """A help text's "recipe: ..." for a hyper-parameter: its value in each recipe."""
    values = {recipe: fields.get(name) for recipe, fields in shipped().items()}

    def show(value):
        if isinstance(value, list):
            return ",".join(f"{v:g}" for v in value) or "none"
        return f"{value:g}" if isinstance(value, float) else str(value)
    if not values:
        return "recipe: see --recipe"
    if len({show(v) for v in values.values()}) == 1:
        return f"recipe: {show(next(iter(values.values())))}"
    return "recipe: " + ", ".join(f"{show(v)} ({recipe})" for recipe, v in values.items())
