"""Convert checkpoints written before the optimizer state left pickle: ONLY for files you trust.

    python tools/convert_states.py runs/demo/model-0003.state.json     (or its .params, or a folder of them)

Older checkpoints hold the optimizer state (`<prefix>-<tag>.states`) as MXNet's Trainer.save_states wrote it: a
Python pickle, which runs whatever code its author put in it when loaded. The kit no longer loads it and asks
for this conversion instead. This is the one place in the kit that unpickles: run it only on checkpoints you (or
someone you trust) wrote. It rewrites the `.states` file as an MXNet NDArray file (host copies) and adds the
optimizer's plain values (update counts) to the state file, whose recorded size, SHA-256 and checksum it
updates; the conversion is exact (the resumed run continues as it would have). A GPU checkpoint converts on any
machine with MXNet's CPU build (`pip install mxnet`): MXNet 1.9.1 reads an array saved from a GPU into host
memory when it is built without CUDA or finds no GPU (NDArray::Load, src/ndarray/ndarray.cc). A CUDA build on a
machine with GPUs copies it to the GPU it came from, and fails when that GPU is not there.
"""
import argparse
import glob
import json
import os
import pickle
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from rn50kit.common import supported  # loads on the Pythons it refuses

if __name__ == "__main__":
    supported.require_supported_python("convert_states")  # before the imports a Python it refuses could fail on

STATE_SUFFIX = ".state.json"


class TrustedUnpickler(pickle.Unpickler):
    """The pickle of a trusted checkpoint; an optimizer class whose module moved since (the kit's SGD, LARS and
    LAMB lived elsewhere before) is read as MXNet's class of that name (the same attributes)."""

    def find_class(self, module, name):
        try:
            return super().find_class(module, name)
        except (ImportError, AttributeError):
            import mxnet as mx
            if name in ("SGD", "NAG", "LARS", "LAMB"):
                return getattr(mx.optimizer, name)
            raise


def state_files(paths):
    """The state files the command line names: state files, checkpoint .params files, folders of them."""
    found = []
    for path in paths:
        if os.path.isdir(path):
            found += sorted(glob.glob(os.path.join(glob.escape(path), "*" + STATE_SUFFIX)))
        elif path.endswith(".params"):
            found.append(path[:-len(".params")] + STATE_SUFFIX)
        else:
            found.append(path)
    return found


def _write_json(path, state):
    from rn50kit.weights import checkpoint
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(state, f, indent=1)
    checkpoint._commit(tmp, path)


def convert_file(states_path, optimizer_name="sgd"):
    """Rewrite the pickle ``states_path`` (Trainer.save_states's output) as an NDArray file, in place; returns the
    plain values (optimizer_state.as_plain). ``optimizer_name``: the optimizer when the pickle holds none."""
    import mxnet as mx

    from rn50kit.weights import checkpoint, optimizer_state
    try:
        with open(states_path, "rb") as f:
            loaded = TrustedUnpickler(f).load()  # the trusted file's pickle: see the module's doc
    except mx.base.MXNetError as error:  # e.g. arrays of a GPU this machine lacks, on a CUDA build
        raise ValueError(f"{states_path} cannot be read here ({checkpoint.mxnet_message(error)}); MXNet's CPU "
                         "build (pip install mxnet) reads a GPU checkpoint on any machine") from None
    updater_states, optimizer = loaded if isinstance(loaded, tuple) and len(loaded) == 2 else (loaded, None)
    if optimizer is None:  # saved without the optimizer: the update counts are lost
        optimizer = mx.optimizer.create(optimizer_name)
    arrays, values = optimizer_state.as_plain(updater_states, optimizer, optimizer._index_update_count)
    tmp = states_path + ".tmp"
    mx.nd.save(tmp, arrays)
    checkpoint._commit(tmp, states_path)
    return values


def convert(state_path):
    """Convert one checkpoint; returns what was done, one line. ValueError when it cannot be."""
    from rn50kit.weights import checkpoint, optimizer_state
    checked, why = checkpoint.inspect(state_path, verify=True)
    if checked is None:
        raise ValueError(why)
    states_path = checked["paths"].get("states")
    if states_path is None:
        return f"{state_path}: no optimizer state, nothing to convert"
    if checked.get("optimizer_state") and optimizer_state.file_kind(states_path) == "ndarray":
        return f"{state_path}: already converted"
    if optimizer_state.file_kind(states_path) != "pickle":
        raise ValueError(f"{states_path} is neither a pickle nor an NDArray file")
    values = convert_file(states_path, (checked.get("args") or {}).get("optimizer", "sgd"))
    with open(state_path) as f:
        state = json.load(f)
    state["optimizer_state"] = values
    state.setdefault("checks", {})["states"] = {"size": os.path.getsize(states_path),
                                                "sha256": checkpoint.sha256(states_path)}
    state["checksum"] = checkpoint.state_checksum(state)
    _write_json(state_path, state)
    return f"{state_path}: converted (optimizer {values['optimizer']}, {len(values['states'])} weights' states)"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] + " See the module's doc.")
    parser.add_argument("checkpoints", nargs="+", help="<prefix>-<tag>.state.json or .params files, or folders")
    args = parser.parse_args(argv)
    files = state_files(args.checkpoints)
    if not files:
        sys.exit(f"convert_states: no {STATE_SUFFIX} file in {' '.join(args.checkpoints)}")
    failed = False
    for path in files:
        try:
            print(convert(path))
        except (ValueError, OSError, pickle.UnpicklingError, EOFError) as error:
            print(f"convert_states: {path}: {error}", file=sys.stderr)
            failed = True
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
