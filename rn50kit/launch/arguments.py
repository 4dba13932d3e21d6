"""runner's command line: its parser, the train.py flags it must know about, and its part of a --config file.

-b is the batch per worker and -l the LR per 256 images; train.py gets the global batch (b*N) and the scaled LR
(l*b*N/256). Every flag runner does not know goes through to train.py (`python train.py --help`).
"""
import argparse
import os
from pathlib import Path

from rn50kit.common.helptext import HelpFormatter
from rn50kit.config import cli, config_files, recipe
from rn50kit.config.cli import UsageError
from rn50kit.launch import launchers
from rn50kit.launch.launchers import elastic

DESCRIPTION = "Launch training or scoring on N workers: scales batch and LR, then runs `horovodrun -np N python " \
              "train.py ...`."
DEFAULT_DATA_ROOT = Path(cli.DEFAULT_DATA_ROOT)
LAYOUT_FLAGS = ("--input-layout", "--conv-layout", "--batchnorm-layout", "--pooling-layout")
# What runner takes from a --config file for itself; train.py reads the whole file again (runner passes it on).
RUNNER_FROM_FILE = ("ngpus", "dtype", "kv_store", "data_backend", "data_root", "launcher", "hosts", "hostfile",
                    "network_interface")


def train_flags_epilog():
    """The help's last paragraph (the recipes listed are those that read: built when the parser is)."""
    return ("Every other flag goes to train.py (`python train.py --help` lists them all) and is checked before any "
            "worker starts. Common ones: --workspace DIR (default: runs/<model>), --resume auto|none|PATH, "
            "--mode train_val|train|val|pred, --recipe " + "|".join(recipe.shipped()) + ", --seed N, "
            "--num-layers N or --model NAME, "
            "--num-classes N, --image-shape C,H,W, --data-val-resize N, --load PATH (val/pred), --keep-last K, "
            "--save-frequency N.")


def get_args_parser():
    parser = argparse.ArgumentParser(description=DESCRIPTION, allow_abbrev=False, formatter_class=HelpFormatter,
                                     epilog=train_flags_epilog())
    parser.add_argument("-n", "--ngpus", type=int, default=1,
                        help="number of workers in all: GPUs, or processes on a machine without GPUs")
    parser.add_argument("-b", "--batch-size", type=int, default=None,
                        help="batch size per worker (default: 192 with GPUs, 32 per worker without)")
    parser.add_argument("-e", "--num-epochs", type=int, default=None,
                        help="number of epochs (default: the recipe's, 90), or of scoring passes with --mode val "
                             "(default: 1)")
    parser.add_argument("-l", "--lr", type=float, default=None,
                        help="learning rate per 256 images (default: the recipe's, 0.256 for nvidia, 0.1 for he "
                             "and nvidia-2019)")
    parser.add_argument("--data-root", type=Path, default=DEFAULT_DATA_ROOT,
                        help="directory with train.rec/.idx and val.rec/.idx")
    parser.add_argument("--dtype", default=None, choices=cli.DTYPES,
                        help="precision (default: float16 with GPUs, float32 without; int8: scoring on the CPU)")
    parser.add_argument("--kv-store", default="horovod", choices=cli.KV_STORES,
                        help="gradient reduction: horovod (one process per worker) or one process for all GPUs")
    parser.add_argument("--data-backend", default=None, choices=cli.DATA_BACKENDS,
                        help="data loading backend (default: dali-gpu with GPUs, dali-cpu without)")
    parser.add_argument("--launcher", default="horovod", choices=launchers.NAMES, help=launchers.HELP)
    add_host_args(parser)
    parser.add_argument("--config", metavar="FILE.toml", default=None,
                        help="settings from a TOML file, for runner and train.py alike (docs/training.md, Configuration"
                             " files): keys are long flag names; batch_size is the global batch, lr the absolute LR; "
                             "the command line wins")
    elastic.add_elastic_args(parser)
    parser.add_argument("--dry-run", action="store_true",
                        help="check everything the run would check before starting (runner's arguments, train.py's "
                             "flags, the machine), print the environment and the command, do not run it")
    parser.set_defaults(file_values={})  # a --config file's values runner plans from (read_config)
    return parser


def add_host_args(parser):
    hosts = parser.add_mutually_exclusive_group()
    hosts.add_argument("-H", "--hosts", default=None,
                       help="multi-node: host:slots list for horovodrun/mpirun, e.g. host1:8,host2:8")
    hosts.add_argument("--hostfile", type=Path, default=None, help="multi-node: file of `host slots=N` lines")
    parser.add_argument("--network-interface", default=None, metavar="IFACE[,IFACE]",
                        help="multi-node: the network interface(s) for Horovod's Gloo, NCCL and MPI traffic "
                             "(default: horovodrun finds the common ones; MPI and NCCL choose their own)")


def peek_parser():
    """The train.py flags runner must know about (mode, explicit data files, workspace, --test-io)."""
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    for flag in ("--mode", "--data-train", "--data-val", "--workspace", "--fuse-bn-relu", "--image-shape",
                 "--gpus", *LAYOUT_FLAGS):
        parser.add_argument(flag)
    parser.add_argument("--test-io", action="store_true")
    return parser


def peek_extra(extra, file_values=None):
    """The values of the train.py flags runner must know about, as the workers will have them: typed in
    ``extra`` (left there as they are), else from the --config file (``file_values``: read_config's)."""
    parser = peek_parser()
    known = {action.dest for action in parser._actions}
    parser.set_defaults(**{dest: value for dest, value in (file_values or {}).items() if dest in known})
    return parser.parse_known_args(extra)[0]


def read_config(path):
    """runner's part of a --config file, converted as its flags would be: its own flags' values, the global
    batch_size, and the train.py flags it plans from (peek_extra's). The rest is train.py's to check."""
    file_settings = config_files.read(path)
    own = {action.dest: action for action in get_args_parser()._actions
           if action.dest in RUNNER_FROM_FILE or action.dest == "batch_size"}
    peeked = {action.dest: action for action in peek_parser()._actions if action.option_strings}
    values = {}
    for dest, value in file_settings.values.items():
        action = own.get(dest) or peeked.get(dest)
        if action is not None:
            values[dest] = config_files.convert(action, value, file_settings.where(dest), dest)
    return values


def parse_runner_args(argv):
    """runner's arguments and train.py's (``extra``): the command line over a --config file over the defaults."""
    parser = get_args_parser()
    args, extra = parser.parse_known_args(argv)
    if args.config is None:
        return args, extra
    path = os.path.abspath(args.config)
    try:
        values = read_config(path)
    except config_files.ConfigError as error:
        raise BadConfigFile(str(error))
    parser.set_defaults(**{dest: value for dest, value in values.items() if dest in RUNNER_FROM_FILE},
                        file_values=values)
    args, extra = parser.parse_known_args(argv)
    args.config = path
    return args, extra


class BadConfigFile(UsageError):
    """runner's --config file is malformed or holds a bad value for runner: the message names the file's line."""


def blame_config_file(message, argv):
    """``message`` with where the --config file of ``argv`` set the flag it names, unless that flag was typed."""
    parser = get_args_parser()
    path = parser.parse_known_args(argv)[0].config
    if path is None:
        return message
    try:
        file_settings = config_files.read(os.path.abspath(path))
    except config_files.ConfigError:
        return message  # the file's own fault is the message already
    typed = {config_files.dest_of(word[2:].partition("=")[0]) for word in argv if word.startswith("--")}
    typed |= {action.dest for action in parser._actions for word in argv if word in action.option_strings}
    return config_files.blame(message, file_settings, typed)


def batch_from_file(args):
    """-b from a --config file's batch_size, which is the global batch (train.py's --batch-size) in a file."""
    batch = args.file_values["batch_size"]
    if batch % args.ngpus:
        raise BadConfigFile(f"batch_size = {batch} in {args.config} is the global batch, and does not divide across "
                            f"{args.ngpus} workers; give a multiple of {args.ngpus}, or -b (per worker)")
    return batch // args.ngpus
