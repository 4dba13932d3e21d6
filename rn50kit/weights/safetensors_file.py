"""``.safetensors`` files read without PyTorch: through the safetensors package's numpy API, or (bfloat16, which
numpy has not) from the format itself; and the stride placement a file's metadata records."""
import json
import os
import struct

import numpy as np

from rn50kit.weights.errors import PretrainedError

SAFETENSORS_PIN = "safetensors==0.8.0"


def read_safetensors(path):
    """name -> float32 array of the file's float tensors; PretrainedError (one line) when it cannot be read."""
    try:
        from safetensors import SafetensorError
        from safetensors.numpy import load_file
    except ImportError:
        raise PretrainedError(f"reading {os.path.basename(path)} needs the safetensors package: "
                              f"pip install {SAFETENSORS_PIN}") from None
    try:
        tensors = load_file(path)
    except (SafetensorError, TypeError, ValueError, KeyError) as error:
        # numpy has no bfloat16, so the package cannot hand those over: decode such files here.
        if "BF16" not in _safetensors_dtypes(path):
            raise PretrainedError(f"--pretrained {path} is not a readable safetensors file: {error}") from None
        tensors = _read_with_bfloat16(path)
    return {key: np.asarray(value, dtype=np.float32) for key, value in tensors.items()
            if np.issubdtype(np.asarray(value).dtype, np.floating)}


def _header_json(f, path):
    """The JSON header of the open safetensors file ``f``, and its length; ValueError when its stated length
    runs past the file's end (a damaged file: reading it would ask for up to 2**64 bytes)."""
    size = struct.unpack("<Q", f.read(8))[0]
    if size > os.path.getsize(path) - 8:
        raise ValueError(f"header length {size} runs past the file's end")
    header = json.loads(f.read(size))
    if not isinstance(header, dict):
        raise ValueError("header is not a JSON object")
    return header, size


def _safetensors_header(path):
    with open(path, "rb") as f:
        header, size = _header_json(f, path)
    header.pop("__metadata__", None)
    return header, 8 + size


def recorded_version(path):
    """The stride placement a .safetensors file's metadata records ("resnet_version": "1" or "1.5", as
    export.py writes it), or None."""
    if not path.lower().endswith(".safetensors"):
        return None
    try:
        with open(path, "rb") as f:
            metadata = _header_json(f, path)[0].get("__metadata__") or {}
    except (OSError, ValueError, struct.error, RecursionError):
        return None
    if not isinstance(metadata, dict):
        return None
    version = metadata.get("resnet_version")
    return version if version in ("1", "1.5") else None


def _safetensors_dtypes(path):
    try:
        return {entry["dtype"] for entry in _safetensors_header(path)[0].values()}
    except (OSError, ValueError, KeyError, TypeError, struct.error, RecursionError):  # entries not objects
        return set()


def _read_with_bfloat16(path):
    """The float tensors of a safetensors file, bfloat16 included (as float32): the format is an 8-byte header
    length, a JSON header (dtype, shape, data_offsets per tensor) and the raw little-endian data."""
    header, start = _safetensors_header(path)
    dtypes = {"F64": "<f8", "F32": "<f4", "F16": "<f2"}
    tensors = {}
    with open(path, "rb") as f:
        for name, entry in header.items():
            begin, end = entry["data_offsets"]
            f.seek(start + begin)
            raw = f.read(end - begin)
            if entry["dtype"] == "BF16":  # the top 16 bits of a float32
                value = (np.frombuffer(raw, "<u2").astype(np.uint32) << 16).view(np.float32)
            elif entry["dtype"] in dtypes:
                value = np.frombuffer(raw, dtypes[entry["dtype"]]).astype(np.float32)
            else:
                continue
            tensors[name] = value.reshape(entry["shape"])
    return tensors
