"""Configuration as files: TOML recipes and `--config FILE.toml`, read and checked against a parser's flags, and a
run's resolved configuration written back as TOML.

Runner reads these files before it may import MXNet: like all of rn50kit/config, this module imports no MXNet
(tests/unit/test_layers.py).

A file's keys are the flags' long names (``num_layers`` or ``num-layers``), at the top level or under a table named
for the flag's argument group (``[optimizer]``, ``[lr_schedule]``) or its config (``[fit]``, ``[data]``: the tables
of a run's resolved config.toml). ``[runner]`` holds runner's own keys; ``[kit]`` (a run's record of the kit and
the files it read) is not read back. One name, one meaning: ``batch_size`` is the global batch (train.py's
--batch-size; runner's -b is per worker), ``lr`` the absolute LR (train.py's --lr; runner's -l is per 256 images).
"""
import argparse
import difflib
import math
import os
import re
import subprocess
import sys

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10 (NVIDIA's MXNet containers): the same parser, published as tomli
    import tomli as tomllib

RUNNER_KEYS = ("ngpus", "launcher", "hosts", "hostfile", "network_interface")  # runner's own, in [runner] or on top
RECORD_TABLE = "kit"  # a resolved config.toml's record of the kit and the files the run read: not settings
NOT_IN_FILES = ("config", "help", "dry_run")  # a file cannot name another file, nor ask for runner's --dry-run


class ConfigError(ValueError):
    """A bad configuration file: one line naming the file, the line and what to do."""


def dest_of(key):
    return key.replace("-", "_")


def flag_of(dest):
    return "--" + dest.replace("_", "-")


def table_name(title):
    """An argument group's title as a TOML table name: "LR schedule" -> lr_schedule."""
    return re.sub(r"[^a-z0-9]+", "_", title.lower()).strip("_")


def read_toml(path, what="--config"):
    """The tables of the TOML file ``path``; a ConfigError (one line) for a missing, unreadable or malformed one."""
    path = os.fspath(path)
    if not os.path.exists(path):
        raise ConfigError(f"{what} {path} does not exist; give the path of a .toml file")
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except tomllib.TOMLDecodeError as error:
        message = str(error)
        at = re.search(r"\(at line (\d+), column (\d+)\)", message)
        message = re.sub(r"\s*\(at (line \d+, column \d+|end of document)\)", "", message)
        where = f"line {at[1]}, column {at[2]}" if at else "at its end"
        raise ConfigError(f"{path} {where}: {message} (not valid TOML; see https://toml.io)")
    except (OSError, UnicodeDecodeError) as error:
        raise ConfigError(f"{what} {path} cannot be read ({getattr(error, 'strerror', None) or error})")
    except RecursionError:  # Python's parser recurses per level of nested arrays or inline tables
        raise ConfigError(f"{path}: arrays or tables nested too deeply to read (not a settings file)") from None


def key_lines(path):
    """{(table, dest): line number} of the keys of a TOML file, for messages (tomllib gives values, not lines)."""
    lines, table = {}, ""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read().splitlines()
    except (OSError, UnicodeDecodeError):
        return lines
    for number, line in enumerate(text, 1):
        header = re.match(r"\s*\[\s*([^\]\s]+)\s*\]", line)
        if header:
            table = dest_of(header[1].strip("\"'"))
            lines.setdefault(("", table), number)  # a table read as one value ([lr_points]) is named by its header
            continue
        key = re.match(r"\s*([A-Za-z0-9_-]+|\"[^\"]*\"|'[^']*')\s*=", line)
        if key:
            lines.setdefault((table, dest_of(key[1].strip("\"'"))), number)
    return lines


class Settings:
    """The flat settings of one file: ``values`` {dest: value as TOML gave it}, where each was written, and the
    tables they were under."""

    def __init__(self, path, values, tables, lines):
        self.path, self.values, self.tables, self.lines = path, values, tables, lines

    def where(self, dest):
        line = self.lines.get((self.tables.get(dest, ""), dest))
        return f"{self.path} line {line}" if line else str(self.path)


def flatten(path, data, what="--config"):
    """The Settings of a file's tables: top-level keys and those of its tables, one dest each."""
    lines = key_lines(path)
    values, tables = {}, {}

    def take(table, key, value):
        dest = dest_of(key)
        if dest in values:
            raise ConfigError(f"{path} line {lines.get((table, dest), '?')}: '{key}' is set twice (also "
                              f"{f'in [{tables[dest]}]' if tables[dest] else 'at the top level'}); keep one")
        values[dest], tables[dest] = value, table

    for key, value in data.items():
        if isinstance(value, dict) and dest_of(key) != "lr_points":
            if dest_of(key) == RECORD_TABLE:
                continue
            for inner, inner_value in value.items():
                if isinstance(inner_value, dict):
                    raise ConfigError(f"{path} line {lines.get((dest_of(key), dest_of(inner)), '?')}: "
                                      f"[{key}.{inner}]: tables hold flags, not other tables")
                take(dest_of(key), inner, inner_value)
        else:
            take("", key, value)
    return Settings(path, values, tables, lines)


def read(path, what="--config"):
    """The Settings of the TOML file ``path`` (ConfigError for a bad one)."""
    return flatten(path, read_toml(path, what), what)


def show(value):
    """``value`` as the file wrote it (TOML's quotes, booleans and lists)."""
    if isinstance(value, list):
        return "[" + ", ".join(show(v) for v in value) + "]"
    return f'"{value}"' if isinstance(value, str) else str(value).lower() if isinstance(value, bool) else str(value)


def as_text(value):
    """A TOML value as the command line's text: lists comma-separated (--image-shape 3,224,224)."""
    if isinstance(value, list):
        return ",".join(as_text(v) for v in value)
    return str(value)


def convert(action, value, where, key, as_flag=False):
    """``value`` of a file converted as the parser converts the flag ``action`` (its type and choices). One rule:
    a key takes what its flag takes on the command line, written in TOML: a number or its text (batch_size = 32 or
    "32"), and true/false for a yes-or-no setting, a switch's or a 0/1 flag's (random_mirror = false is 0). A
    switch's value is its destination's (zero_init_last_gamma = false), or with ``as_flag`` whether the flag is
    given (no-zero-init-last-gamma = true)."""
    flag = action.option_strings[-1]
    if action.nargs == 0:  # --fp16-allreduce and the like: true or false
        if not isinstance(value, bool):
            raise ConfigError(f"{where}: {key} = {show(value)}: expected true or false ({flag} is a switch)")
        return (action.const if value else action.default) if as_flag else value
    if isinstance(value, bool) and action.choices is not None and sorted(action.choices) == [0, 1]:
        return int(value)  # --random-mirror 0/1 and the like: yes or no, as a switch's
    if isinstance(value, bool) or isinstance(value, (dict,)) or value is None:
        raise ConfigError(f"{where}: {key} = {show(value)}: expected {expected(action)} ({flag})")
    if value == [] and takes_a_list(action):  # an empty list: the flag's "none" (--lr-steps "", --train-size)
        return []
    texts = [as_text(v) for v in value] if isinstance(value, list) and action.nargs in ("+", "*") else \
        [as_text(value)]
    converted = []
    for text in texts:
        try:
            item = action.type(text) if action.type else text
        except (ValueError, TypeError, argparse.ArgumentTypeError) as error:
            detail = f": {error}" if isinstance(error, argparse.ArgumentTypeError) else ""
            raise ConfigError(f"{where}: {key} = {show(value)}: expected {expected(action)} ({flag}){detail}")
        if any(isinstance(v, float) and not math.isfinite(v) for v in (item if isinstance(item, list) else [item])):
            # TOML's nan and inf: a run silently wrong (a loss of nan, a weight decay of inf)
            raise ConfigError(f"{where}: {key} = {show(value)}: expected a finite number ({flag})")
        if action.choices is not None and item not in action.choices:
            raise ConfigError(f"{where}: {key} = {show(value)}: not one of "
                              f"{', '.join(str(c) for c in action.choices)} ({flag})")
        converted.append(item)
    return converted if action.nargs in ("+", "*") else converted[0]


def takes_a_list(action):
    """Whether the flag's value is a list (a comma-separated type such as --image-shape's, or nargs)."""
    if action.nargs in ("+", "*"):
        return True
    try:
        return isinstance(action.type("1"), list) if action.type else False
    except (ValueError, TypeError, argparse.ArgumentTypeError):
        return False


def expected(action):
    kind = getattr(action.type, "__name__", "")
    return {"int": "an integer", "float": "a number", "int_list": "a list of integers",
            "float_list": "a list of numbers"}.get(kind, "a string" if action.type is None else
                                                     f"a value {action.option_strings[-1]} accepts")


def known_tables(parser, extra_tables=None):
    """{table name: dests allowed under it}: the parser's argument groups, and ``extra_tables`` (a run's configs)."""
    tables = {}
    for group in parser._action_groups:
        dests = {a.dest for a in group._group_actions if a.option_strings}
        if dests:
            tables.setdefault(table_name(group.title), set()).update(dests)
    for name, dests in (extra_tables or {}).items():
        tables.setdefault(name, set()).update(dests)
    tables.setdefault("runner", set()).update(RUNNER_KEYS)
    return tables


def closest(word, candidates):
    found = difflib.get_close_matches(word, sorted(candidates), n=1, cutoff=0.6)
    return f"; did you mean '{found[0]}'?" if found else ""


def check_against(settings, parser, extra_tables=None, ignore=RUNNER_KEYS, allowed=()):
    """{dest: value converted as the parser would} of ``settings`` for ``parser``'s flags; a ConfigError names an
    unknown key (with the closest known one), a key under the wrong table, or a value the flag refuses.
    ``ignore``: keys read by another command (runner's); ``allowed``: other keys to pass through unconverted."""
    actions = {a.dest: a for a in parser._actions if a.option_strings and a.dest not in NOT_IN_FILES}
    switches = {dest_of(option[2:]): a for a in actions.values() if a.nargs == 0
                for option in a.option_strings if option.startswith("--") and dest_of(option[2:]) not in actions}
    tables = known_tables(parser, extra_tables)
    known = set(actions) | set(switches) | set(ignore) | set(allowed)
    values = {}
    for key, value in settings.values.items():
        where, table = settings.where(key), settings.tables[key]
        dest = switches[key].dest if key in switches else key
        if table and table not in tables:
            raise ConfigError(f"{where}: unknown table [{table}]{closest(table, tables)} (tables are argument "
                              "groups, a run's configs, or [runner])")
        if dest not in known:
            raise ConfigError(f"{where}: unknown key '{key}'{closest(key, known)} (keys are the flags' long "
                              "names: see `python train.py --help` and `./runner --help`)")
        if table and dest not in tables[table]:
            home = sorted(name for name, dests in tables.items() if dest in dests)
            raise ConfigError(f"{where}: '{key}' does not belong in [{table}]; put it at the top level or in "
                              + " or ".join(f"[{name}]" for name in home))
        if dest in ignore:
            continue
        if dest in values:
            raise ConfigError(f"{where}: '{key}' sets {flag_of(dest)} a second time; keep one")
        values[dest] = value if dest in allowed else convert(actions[dest], value, where, key, key in switches)
    return values


def blame(message, settings, typed=()):
    """``message`` about a flag, with where a file set it when the flag came from there (not from ``typed``)."""
    if settings is None or str(settings.path) in message:  # no file, or the message names it already
        return message
    for dest in settings.values:
        if dest not in typed and re.search(re.escape(flag_of(dest)) + r"\b", message):
            return f"{message} (set by {dest} in {settings.where(dest)})"
    return message


def kit_identity(kit_dir):
    """{"version", "commit"} of the kit at ``kit_dir`` (what is known: an installed kit has no git commit)."""
    identity = {}
    try:
        from importlib import metadata
        identity["version"] = metadata.version("rn50-kit")
    except Exception:  # not installed: the version in setup.py
        setup = os.path.join(kit_dir, "setup.py")
        found = re.search(r'version="([^"]+)"', open(setup).read()) if os.path.isfile(setup) else None
        if found:
            identity["version"] = found[1]
    try:
        commit = subprocess.run(["git", "-C", str(kit_dir), "rev-parse", "HEAD"], capture_output=True, text=True)
        if commit.returncode == 0 and commit.stdout.strip():
            identity["commit"] = commit.stdout.strip()
    except OSError:
        pass
    return identity


def toml_ready(value):
    """A config value as TOML holds it (None has no TOML form: such fields are left out, which reads back as the
    default None)."""
    if isinstance(value, (tuple, list)):
        return [toml_ready(v) for v in value]
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    return value


def write_resolved(path, tables):
    """``tables`` ({table: {key: value}}) as TOML at ``path``, atomically (a temporary file renamed over it), with
    tomli-w; keys whose value is None are left out."""
    import tomli_w
    document = {name: {key: toml_ready(value) for key, value in fields.items() if value is not None}
                for name, fields in tables.items()}
    text = ("# The resolved configuration of this run: every setting as it was used. Replay it with\n"
            "# ./runner --config THIS_FILE --workspace NEW_DIR  (a flag on the command line wins)\n"
            + tomli_w.dumps(document))
    temporary = f"{path}.tmp-{os.getpid()}"
    with open(temporary, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(temporary, path)
    return path
