"""What the kit's commands share without importing MXNet (runner chooses its Python before it can import it):
the choices of the precision, data and gradient flags, the data defaults, one-line errors, and the Python that
runner and benchmark.py run under."""
import argparse
import dataclasses
import importlib.util
import os
import shutil
import sys

from rn50kit.common import backends

DTYPES = ["float32", "float16", "bfloat16", "int8"]
DATA_BACKENDS = backends.NAMES
KV_STORES = ["horovod", "device", "local"]
DEFAULT_DATA_ROOT = "/data/imagenet/train-val-recordio-passthrough"
PREPARE_HINT = ("prepare ImageNet with `tools/prepare_imagenet.sh RAW_DIR OUT_DIR`, "
                "or run `make demo` to build the demo set")


def batches_ahead(text):
    """argparse type of --dali-read-ahead (train.py) and --read-ahead (tools/bench_io.py): 0 or more batches."""
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected 0 or more batches, got {text}")
    return value


def data_root_problem(root, layout):
    """Why ``root`` cannot be a --data-root holding ``layout``'s files (backends.RootLayout), or None; runner and
    train.py alike."""
    root = str(root)
    if os.path.isfile(root):
        folder = os.path.dirname(os.path.abspath(root))
        return (f"--data-root {root} is a file; give the folder that holds {' and '.join(layout.data_names())} "
                f"(--data-root {folder}), or name the files with --data-train/--data-val")
    if not os.path.isdir(root):
        listed = "/".join(name.rstrip("/") for name in layout.data_names())
        return (f"data root {root} does not exist; give --data-root DIR (with {listed}) or "
                f"--data-train/--data-val; {PREPARE_HINT}")
    if not any(os.path.exists(os.path.join(root, name)) for name in layout.data_names()) and \
            holds_class_folders(root):
        return (f"--data-root {root} holds folders of images, not {' and '.join(layout.data_names())}: pack them "
                f"with `python tools/prepare_folder.py {root} OUT` (docs/own-images.md) and give --data-root OUT")
    return None


IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".tif", ".tiff", ".webp")  # tools/prepare_folder.py's


def holds_class_folders(root, folders=20):
    """Whether ``root`` looks like ROOT/<class>/<image>: one of its first ``folders`` folders holds an image."""
    try:
        with os.scandir(root) as entries:
            subfolders = sorted(entry.path for entry in entries if entry.is_dir())[:folders]
        for folder in subfolders:
            with os.scandir(folder) as entries:
                if any(entry.is_file() and entry.name.lower().endswith(IMAGE_SUFFIXES) for entry in entries):
                    return True
    except OSError:
        return False
    return False


PYTHON_VARIABLE = "RN50_PYTHON"  # the Python runner and benchmark.py run under, when set


def config_defaults(config_class):
    """A config dataclass's defaults as parser defaults (the dataclass is where a flag's default is written; tuples
    become lists, as the parser gives for a typed value)."""
    return {field.name: list(field.default) if isinstance(field.default, tuple) else field.default
            for field in dataclasses.fields(config_class) if field.default is not dataclasses.MISSING}


def config_from(config_class, namespace, **overrides):
    """``config_class`` made of the same-named values of a parsed ``namespace`` (lists become tuples: a config is
    frozen), with ``overrides`` on top."""
    values = {}
    for field in dataclasses.fields(config_class):
        value = overrides[field.name] if field.name in overrides else getattr(namespace, field.name)
        values[field.name] = tuple(value) if isinstance(value, list) else value
    return config_class(**values)


class UsageError(Exception):
    """A problem with the user's input: reported as one line, without a traceback."""


def fail(prog, message):
    """``prog: error: message`` on stderr, exit status 2 (argparse's convention)."""
    print(f"{prog}: error: {message}", file=sys.stderr)
    sys.exit(2)


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a bad flag is one `error:` line (the usage is in --help)."""

    def error(self, message):
        fail(self.prog, f"{message} (see --help)")


def python_to_use(current, named, current_has_mxnet, kit_python):
    """The Python to re-run under, or None to stay in ``current``: the one named in $RN50_PYTHON, else the current
    one when it has MXNet (an activated .venv-gpu, or `.venv-gpu/bin/python runner`), else the kit's .venv
    (``kit_python``, None when there is none). Paths are compared unresolved: venvs link the same binary."""
    if named:
        named = shutil.which(named) or named
        return None if os.path.abspath(named) == os.path.abspath(current) else os.path.abspath(named)
    if current_has_mxnet or kit_python is None:
        return None
    return kit_python


def rerun_under_chosen_python(script, prog, kit_dir):
    """Re-execute ``script`` under the Python python_to_use picks (``kit_dir``/.venv's when this one has no
    MXNet), saying so when it is not the user's choice."""
    kit_python = os.path.join(kit_dir, ".venv", "bin", "python")
    has_mxnet = importlib.util.find_spec("mxnet") is not None
    chosen = python_to_use(sys.executable, os.environ.get(PYTHON_VARIABLE), has_mxnet,
                           kit_python if os.path.isfile(kit_python) else None)
    if chosen is None:
        return
    if not os.access(chosen, os.X_OK) or os.path.isdir(chosen):
        fail(prog, f"{PYTHON_VARIABLE}={os.environ[PYTHON_VARIABLE]} is not a Python interpreter; name one, e.g. "
                   ".venv-gpu/bin/python")
    if not os.environ.get(PYTHON_VARIABLE):
        print(f"{prog}: note: {sys.executable} has no MXNet; running under {chosen} (set {PYTHON_VARIABLE}=PYTHON "
              "or start with the Python of your environment to choose another)", file=sys.stderr, flush=True)
    os.environ[PYTHON_VARIABLE] = chosen
    os.execv(chosen, [chosen, str(script)] + sys.argv[1:])
