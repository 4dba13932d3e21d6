"""What only MXNet can tell runner's launch check, without MXNet in runner's process (importing it takes 3 s of
every launch and dry run): asked once of a Python that imports train (train.print_answer), then kept in
~/.cache/rn50-kit/mxnet-answers.json under what the answer depends on, always with the MXNet build that gave it.

- network_sizes: a run's network's parameters and activation elements per image, for the memory estimate of a
  CPU run; kept under the model's flags, the image shape and layout, the dtype and the kit's code.
- nvidia_fused_batchnorm: whether this MXNet has NVIDIA's fused BatchNorm ops (a float16 GPU run's defaults).
- params_problem: whether MXNet reads a --load file that has no state file to verify it against (never kept: the
  file may change).

An entry that cannot be read is asked again, never trusted; a cache that cannot be written only costs the time.
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
_PARAMS_READ = {}  # (path, size, mtime) -> params_problem's answer, in this process


def cache_path(environ=os.environ):
    home = environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(home, "rn50-kit", "mxnet-answers.json")


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


def key(question, **parts):
    """What ``question``'s answer depends on, this MXNet's build included, as one string."""
    parts = {**parts, "question": question, "mxnet": mxnet_build()}
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()


def network_key(cfg):
    """What a RunConfig's network's sizes depend on."""
    return key("network_sizes", model=dataclasses.asdict(cfg.model), image_shape=list(cfg.data.image_shape),
               input_layout=cfg.data.input_layout, dtype=cfg.fit.dtype, code=kit_code())


def read_cache(path):
    try:
        with open(path) as f:
            entries = json.load(f)
    except (OSError, ValueError):
        return {}
    return entries if isinstance(entries, dict) else {}


def valid_sizes(entry):
    return (isinstance(entry, dict) and all(isinstance(entry.get(name), int) and entry[name] > 0
                                            for name in ("parameters", "activations")))


def valid_flag(entry):
    return isinstance(entry, dict) and isinstance(entry.get("fused"), bool)


def write_cache(path, entries):
    """Write ``entries`` whole (a temporary file renamed), the newest MAX_ENTRIES; a failure only loses the cache."""
    kept = dict(list(entries.items())[-MAX_ENTRIES:])
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=os.path.dirname(path), prefix=".mxnet-answers-",
                                         delete=False) as f:
            json.dump(kept, f)
        os.replace(f.name, path)
    except OSError:
        pass


def ask(question, argv=()):
    """``question`` asked of a Python that imports train (about 3 s); None when it cannot tell. An answer that is
    a refusal (a network the flags cannot build) is their UsageError."""
    asked = subprocess.run([sys.executable, "-c", "import sys; sys.path.insert(0, sys.argv.pop(1)); import train; "
                            "train.print_answer(sys.argv[1], sys.argv[2:])", str(KIT_DIR), question, *argv],
                           stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        answer = json.loads(asked.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return None
    if isinstance(answer, dict) and isinstance(answer.get("refusal"), str):
        raise UsageError(answer["refusal"])
    return answer if asked.returncode == 0 else None


def cached(name, valid, question, argv=(), path=None):
    """The cache's answer under ``name``, else ``question`` asked and kept; None when neither can tell."""
    path = path or cache_path()
    entries = read_cache(path)
    answer = entries.get(name)
    if not valid(answer):
        answer = ask(question, argv)
        if not valid(answer):
            return None
        entries.pop(name, None)
        entries[name] = answer
        write_cache(path, entries)
    return answer


def network_sizes(cfg, argv, path=None):
    """(parameters, activation elements per image) of the network of ``cfg`` (a RunConfig; ``argv``: the train.py
    flags it came from); None when it cannot be told (the workers estimate it at their start, as always)."""
    sizes = cached(network_key(cfg), valid_sizes, "network_sizes", argv, path)
    return sizes and (sizes["parameters"], sizes["activations"])


def nvidia_fused_batchnorm(path=None):
    """Whether this MXNet has NVIDIA's fused BatchNorm ops (devices.nvidia_fused_batchnorm's answer); False when it
    cannot be told (no MXNet: no fused ops)."""
    answer = cached(key("nvidia_fused_batchnorm"), valid_flag, "nvidia_fused_batchnorm", (), path)
    return bool(answer and answer["fused"])


def params_problem(path):
    """checkpoint.read_params of ``path`` in a Python that imports train: the file's problem (one line), or None
    for a file MXNet reads or an answer that cannot be had (each worker reads it). Asked once per version of the
    file in this process (a scoring launch checks its --load twice)."""
    stat = os.stat(path)
    version = (os.path.abspath(path), stat.st_size, stat.st_mtime_ns)
    if version not in _PARAMS_READ:
        _PARAMS_READ[version] = ask("params_problem", [path])
    answer = _PARAMS_READ[version]
    if isinstance(answer, dict) and isinstance(answer.get("problem"), str):
        return answer["problem"]
    return None
