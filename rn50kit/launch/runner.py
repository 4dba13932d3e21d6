"""runner's main (the `runner` script is a thin layer over it): this machine detected, the launch planned and
checked, train.py's flags checked, then the plan printed (--dry-run) or run through the launcher of --launcher."""
import os
import shlex
import sys

from rn50kit.config import cli
from rn50kit.config.cli import UsageError
from rn50kit.launch import arguments, checks, environment, launchers, machine, plan, supervision, train_flags


def fail(message):
    cli.fail("runner", message)


def main(argv=None, kit_dir=plan.KIT_DIR):
    """runner: ``kit_dir`` is the folder of the train.py to start (runner's own)."""
    argv = sys.argv[1:] if argv is None else argv
    extra = arguments.get_args_parser().parse_known_args(argv)[1]  # --help and malformed flags, before the machine
    try:
        described = machine.detect_machine()  # looked up here: the docs' dry runs replace it with an 8-GPU node
        args, env, command = plan.plan_launch(argv, described, os.environ, kit_dir)
    except UsageError as error:
        refuse(error, argv, extra, kit_dir)
    if described.note:
        print(f"runner: note: {described.note}", file=sys.stderr)
    launcher = launchers.get(args.launcher)
    given = arguments.peek_extra(extra, args.file_values)
    if launcher.supervises(args) and not args.dry_run:  # first: a busy workspace's checkpoints may be half written
        busy = checks.refuse_busy_workspace(given)
        if busy:
            fail(busy)
    # a dry run refuses what the run would, before launching: the flags and what can be known of the run
    checkpoint_prefix = train_flags.check_train_flags(train_flags.train_arguments(command),
                                                      plan.launch_description(args, described, launcher))
    if args.dry_run:
        for key, value in env.items():  # shell-quoted: a pasted plan runs the same words (a discovery command)
            print(f"{key}={shlex.quote(str(value))}")
        print(shlex.join(str(part) for part in command))
        return
    os.environ.update(env)  # horovodrun and mpirun pass the environment on to every worker
    os.environ.update(environment.console_env(args, launcher))
    if launcher.supervises(args):
        sys.exit(supervision.supervise(launcher, args, command, given.workspace, checkpoint_prefix))
    launcher.run_alone(command, given.workspace)


def refuse(error, argv, extra, kit_dir):
    """runner's one line for a refused plan, naming where a --config file set the flag it blames. A bad train.py
    value in the file is the line to read, not the plan it led to: train.py's check speaks first."""
    config = arguments.get_args_parser().parse_known_args(argv)[0].config
    if config and not isinstance(error, arguments.BadConfigFile):
        train_flags.check_train_flags(extra + ["--config", os.path.abspath(config)])
    fail(arguments.blame_config_file(str(error), argv))
