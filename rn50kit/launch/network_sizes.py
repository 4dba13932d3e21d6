"""The sizes of a run's network (its parameters, and its activation elements per image) for runner's memory
estimate of a CPU run, without MXNet in runner's process: measured once by a Python that imports train and
builds the network (train.print_network_sizes, about 3 s), then kept in ~/.cache/rn50-kit/network-sizes.json
under what shapes the network: the model's flags, the image shape and layout, the dtype, the kit's code and the
MXNet it runs on. A cache that cannot be read or written is measured again, never trusted.
"""
import dataclasses
import hashlib
import importlib.util
import json
import os
import subprocess
import sys
import tempfile

from rn50kit import KIT_DIR
from rn50kit.config.cli import UsageError

MAX_ENTRIES = 200  # a few hundred networks: the file stays small and is read whole


def cache_path(environ=os.environ):
    home = environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(home, "rn50-kit", "network-sizes.json")


def kit_code():
    """A digest of the kit's Python code (models.py and the package): any change to it measures again."""
    digest = hashlib.sha256()
    files = [os.path.join(KIT_DIR, "models.py")]
    for folder, subfolders, names in os.walk(os.path.join(KIT_DIR, "rn50kit")):
        subfolders.sort()
        files += [os.path.join(folder, name) for name in sorted(names) if name.endswith(".py")]
    for path in filter(os.path.isfile, files):  # installed: models.py beside the package, or elsewhere
        with open(path, "rb") as f:
            digest.update(os.path.relpath(path, KIT_DIR).encode() + b"\0" + f.read())
    return digest.hexdigest()


def mxnet_build():
    """Where this Python's MXNet is and when it was installed, found without importing it."""
    spec = importlib.util.find_spec("mxnet")
    if spec is None or not spec.origin:
        return None
    return [spec.origin, os.stat(spec.origin).st_mtime_ns]


def key(cfg):
    """What the network's sizes depend on, as one string."""
    parts = {"model": dataclasses.asdict(cfg.model), "image_shape": list(cfg.data.image_shape),
             "input_layout": cfg.data.input_layout, "dtype": cfg.fit.dtype, "code": kit_code(),
             "mxnet": mxnet_build()}
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()


def read_cache(path):
    try:
        with open(path) as f:
            entries = json.load(f)
    except (OSError, ValueError):
        return {}
    return entries if isinstance(entries, dict) else {}


def valid(entry):
    return (isinstance(entry, dict) and all(isinstance(entry.get(name), int) and entry[name] > 0
                                            for name in ("parameters", "activations")))


def write_cache(path, entries):
    """Write ``entries`` whole (a temporary file renamed), the newest MAX_ENTRIES; a failure only loses the cache."""
    kept = dict(list(entries.items())[-MAX_ENTRIES:])
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=os.path.dirname(path), prefix=".network-sizes-",
                                         delete=False) as f:
            json.dump(kept, f)
        os.replace(f.name, path)
    except OSError:
        pass


def measure(argv):
    """The sizes of the network train.py's flags ``argv`` build, measured in a Python that imports train; None
    when it cannot tell (then the workers estimate it at their start, as they always do). A network those flags
    cannot build is their UsageError."""
    measured = subprocess.run([sys.executable, "-c", "import sys; sys.path.insert(0, sys.argv.pop(1)); import train; "
                               "train.print_network_sizes(sys.argv[1:])", str(KIT_DIR), *argv],
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        sizes = json.loads(measured.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return None
    if isinstance(sizes, dict) and isinstance(sizes.get("refusal"), str):
        raise UsageError(sizes["refusal"])
    return sizes if measured.returncode == 0 and valid(sizes) else None


def network_sizes(cfg, argv, path=None):
    """(parameters, activation elements per image) of the network of ``cfg`` (a RunConfig; ``argv``: the train.py
    flags it came from), from the cache or measured; None when neither can tell."""
    path = path or cache_path()
    entries, name = read_cache(path), key(cfg)
    sizes = entries.get(name)
    if not valid(sizes):
        sizes = measure(argv)
        if sizes is None:
            return None
        entries.pop(name, None)
        entries[name] = sizes
        write_cache(path, entries)
    return sizes["parameters"], sizes["activations"]
