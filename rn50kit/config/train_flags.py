"""train.py's command line, MXNet-free: its complete parser, the order its values come in (the command line over
--config's file over --recipe's defaults over the parser's own, timm's order for its config files), the defaults
that follow from other flags, and the checks of the hyper-parameters.

train.py calls these (then rn50kit.training.configure); runner checks a command's train.py flags with check() in
its own process, before choosing or importing anything heavy. Nothing here imports MXNet
(tests/unit/test_train_flags.py parses a full command line with MXNet blocked).
"""
import argparse
import dataclasses
import os
import sys

from rn50kit.common import backends
from rn50kit.common.helptext import HelpFormatter
from rn50kit.config import cli, config_files, recipe, settings, train_config
from rn50kit.config.cli import OneLineParser, UsageError
from rn50kit.config.data_flags import add_dali_args, add_data_args, add_data_aug_args
from rn50kit.config.faults_flags import add_watchdog_args
from rn50kit.config.finetune_flags import add_pretrained_args, check_pretrained_args
from rn50kit.config.fit_flags import add_fit_args
from rn50kit.config.fit_flags import check as check_fit
from rn50kit.config.model_flags import add_model_args
from rn50kit.config.scoring_flags import add_pred_args, add_quantize_args, check_pred_args

DESCRIPTION = "Train or score a ResNet on ImageNet-style RecordIO with MXNet Gluon, Horovod and DALI."
PROG = "train.py"


def get_args_parser(recipe_name=recipe.DEFAULT_RECIPE, file_settings=None):
    """train.py's flags, with ``recipe_name``'s hyper-parameters as their defaults and a config file's
    ``file_settings`` (config_files.Settings) over them; the command line wins over both."""
    parser = OneLineParser(description=DESCRIPTION, formatter_class=HelpFormatter)
    for add in (add_model_args, add_fit_args, add_pretrained_args, add_data_args, add_dali_args, add_data_aug_args,
                add_quantize_args, add_pred_args, add_watchdog_args):  # watchdog: faults' --stall-timeout
        add(parser)
    parser.set_defaults(**recipe_values(parser, recipe_name))
    if file_settings is not None:
        parser.set_defaults(**{**file_values(parser, file_settings), "recipe": recipe_name})
    return parser


def recipe_values(parser, recipe_name):
    """The flag defaults ``recipe_name`` sets, each checked as its flag would be (a user's recipe file may be
    wrong); the recipe's file is read here, when it is used."""
    recipe.load_recipe(recipe_name)  # the recipe's own rules (its LR, its epochs): one ConfigError line
    recipe_settings = config_files.read(recipe.recipe_file(recipe_name), "--recipe")
    values = config_files.check_against(recipe_settings, parser, ignore=(),
                                        allowed=("lr_per_256", "lr_points"))
    return {key: value for key, value in values.items() if key not in recipe.DERIVED_FIELDS}


def config_tables():
    """The tables a config file may use besides the argument groups: a run's configs (a resolved config.toml's)."""
    return {name: {field.name for field in dataclasses.fields(cls)} for name, cls in train_config.CONFIGS.items()}


def file_values(parser, file_settings):
    """A config file's values, checked and converted as the flags' (runner's own keys left to runner)."""
    return config_files.check_against(file_settings, parser, config_tables(), allowed=("recipe",))


def read_settings(argv):
    """The Settings of --config's file in ``argv``, or None (a ConfigError for a bad file)."""
    probe = argparse.ArgumentParser(add_help=False)
    probe.add_argument("--config")
    path = probe.parse_known_args(argv)[0].config
    return None if path is None else config_files.read(os.path.abspath(path))


def chosen_recipe(argv, file_settings=None):
    """--recipe's value in ``argv``, else the config file's (a path relative to the file's folder), else the
    default recipe; a bad name on the command line is left to the full parser."""
    probe = argparse.ArgumentParser(add_help=False)
    probe.add_argument("--recipe")
    typed = probe.parse_known_args(argv)[0].recipe
    if typed is not None:
        try:
            return recipe.recipe_argument(typed)
        except argparse.ArgumentTypeError:
            return recipe.DEFAULT_RECIPE
    if file_settings is None or "recipe" not in file_settings.values:
        return recipe.DEFAULT_RECIPE
    named = file_settings.values["recipe"]
    if isinstance(named, str) and recipe.is_recipe_file(named):
        named = os.path.join(os.path.dirname(file_settings.path), named)
    try:
        return recipe.recipe_argument(str(named))
    except argparse.ArgumentTypeError as error:
        raise config_files.ConfigError(f"{file_settings.where('recipe')}: {error}")


def parse_args(argv=None, prog=None):
    """The command line over --config's file over --recipe's defaults over the parser's own; a bad file or recipe
    is one error line (exit status 2)."""
    argv = sys.argv[1:] if argv is None else [str(arg) for arg in argv]
    try:
        file_settings = read_settings(argv)
        parser = get_args_parser(chosen_recipe(argv, file_settings), file_settings)
    except config_files.ConfigError as error:
        cli.fail(prog or PROG, str(error))
    if prog:
        parser.prog = prog
    args = parser.parse_args(argv)
    if args.config:
        args.config = os.path.abspath(args.config)
    return args


def given_flags(argv):
    """The destinations set by the user: the flags typed in ``argv`` and the keys of its --config file."""
    parser, file_settings = get_args_parser(), read_settings(argv)
    from_file = set() if file_settings is None else set(file_values(parser, file_settings))
    return settings.given_flags(parser, argv) | from_file


def typed_flags(argv):
    """The destinations of the flags typed in ``argv`` (not its file's): a message about one of the file's keys
    names the file (config_files.blame)."""
    return settings.given_flags(get_args_parser(), argv)


def fill_hyper_parameters(args, given=()):
    """The defaults that depend on other flags: the recipe's epochs for training, its LR for the effective global
    batch (--batch-size x --grad-accum-steps), and its LR steps scaled to the run's length (unless typed). Returns
    notes for the log on how the LR was found and what was scaled."""
    notes = []
    if args.num_epochs is None:
        args.num_epochs = recipe.recipe_epochs(args.recipe)
    if args.lr is None:
        args.lr, how = recipe.recipe_lr_source(args.recipe, args.batch_size * max(args.grad_accum_steps, 1))
        notes.append(how)
    recipe_steps = recipe.recipe(args.recipe)["lr_steps"]
    if (args.mode in ("train", "train_val") and args.lr_schedule == "step" and "lr_steps" not in given
            and recipe_steps and list(args.lr_steps) == list(recipe_steps)
            and args.num_epochs != recipe.recipe_epochs(args.recipe)):
        args.lr_steps = recipe.steps_for_length(args.recipe, args.num_epochs)
        notes.append(f"--lr-steps {','.join(f'{s:g}' for s in args.lr_steps)}: recipe {args.recipe}'s steps "
                     f"{','.join(f'{s:g}' for s in recipe_steps)} of {recipe.recipe_epochs(args.recipe)} epochs, "
                     f"scaled to this run's {args.num_epochs} (give --lr-steps to choose them)")
    return [note for note in notes if note]


def check_config(cfg):
    """Every hyper-parameter of a RunConfig, checked (a UsageError names the flag)."""
    try:
        check_fit(cfg.fit)
        check_pretrained_args(cfg.finetune)
        if cfg.fit.mode == "pred":
            check_pred_args(cfg.predict.data_pred, cfg.predict.pred_out, cfg.predict.pred_top_k)
    except ValueError as error:
        raise UsageError(str(error))



def problem(argv, elastic=False):
    """Why train.py would refuse the flags ``argv`` before it starts anything (a hyper-parameter out of range, an
    option the chosen optimizer does not take, ``elastic``: a backend an elastic run cannot read with ...), one
    line naming the flag (and the file that set it), or None. Unknown flags, bad values and bad config or recipe
    files end the process with argparse's line and status 2, as train.py does."""
    args = parse_args(argv, prog=PROG)
    if args.mode in ("val", "pred") and args.num_epochs is None:
        args.num_epochs = 1
    try:
        fill_hyper_parameters(args, given_flags(argv))
        check_config(train_config.from_args(args))
        refusal = elastic and backends.elastic_refusal(args.data_backend)
        if refusal:
            raise UsageError(refusal)
    except UsageError as error:
        return config_files.blame(str(error), read_settings(argv), typed_flags(argv))
    return None


def check(argv, elastic=False):
    """train.py's refusal of the flags ``argv`` (of an elastic run's workers, ``elastic``), in this process and
    without MXNet: ``train.py: error: <one line>`` on stderr and exit status 2, as `python train.py ARGV` would
    start with; returns when they are good. (What needs the machine, the data or a checkpoint's file is
    start_checks.check_launch'.)"""
    argv = [str(arg) for arg in argv]
    found = problem(argv, elastic)
    if found:
        cli.fail(PROG, found)
