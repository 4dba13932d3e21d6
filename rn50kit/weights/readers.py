"""A weights file as name -> float32 numpy array, whatever wrote it: safetensors, a PyTorch state dict (needs
PyTorch) or an MXNet ``.params`` file. The names are the file's own (key_maps.py turns them into the kit's)."""
import os

import mxnet as mx

from rn50kit.weights.errors import PretrainedError
from rn50kit.weights.safetensors_file import read_safetensors

TORCH_EXTENSIONS = (".pth", ".pt", ".bin", ".ckpt", ".tar")


def read_weights(path):
    """(name -> float32 numpy array, file format) of a .safetensors, PyTorch or MXNet .params file."""
    if not os.path.isfile(path):
        raise PretrainedError(f"--pretrained {path} does not exist")
    lower = path.lower()
    if lower.endswith(".safetensors"):
        weights, fmt = read_safetensors(path), "safetensors"
    elif lower.endswith(TORCH_EXTENSIONS):
        weights, fmt = _read_torch(path), "pth"
    elif lower.endswith(".params"):
        weights, fmt = _read_params(path), "params"
    else:
        raise PretrainedError(f"--pretrained {path}: unknown format; give a .safetensors, .pth or .params file")
    if not weights:
        raise PretrainedError(f"--pretrained {path} holds no tensors")
    return weights, fmt


def _read_torch(path):
    try:
        import torch
    except ImportError:
        stem = os.path.splitext(path)[0]
        raise PretrainedError(
            f"{os.path.basename(path)} is a PyTorch file and PyTorch is not installed here: pip install torch, or "
            f"convert it once where PyTorch is: python -c \"import torch, safetensors.torch as s; "
            f"d = torch.load('{path}', map_location='cpu', weights_only=True); d = d.get('state_dict', d); "
            f"s.save_file({{k: v.contiguous() for k, v in d.items()}}, '{stem}.safetensors')\" "
            f"and give --pretrained {stem}.safetensors") from None
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # noqa: BLE001 - torch raises many kinds; the user needs one line
        raise PretrainedError(f"--pretrained {path}: PyTorch cannot read it as a state dict: "
                              f"{str(error).splitlines()[0] if str(error) else type(error).__name__}") from None
    for wrapper in ("state_dict", "model", "model_state", "model_state_dict"):
        if isinstance(obj, dict) and isinstance(obj.get(wrapper), dict):
            obj = obj[wrapper]
            break
    if not isinstance(obj, dict):
        raise PretrainedError(f"--pretrained {path} holds a {type(obj).__name__}, not a state dict "
                              "(save model.state_dict())")
    return {key: value.detach().to(torch.float32).numpy() for key, value in obj.items()
            if isinstance(value, torch.Tensor) and value.is_floating_point()}


def _read_params(path):
    try:
        loaded = mx.nd.load(path)
    except mx.base.MXNetError as error:
        raise PretrainedError(f"--pretrained {path} is not an MXNet parameter file: "
                              f"{str(error).splitlines()[0]}") from None
    if not isinstance(loaded, dict):
        raise PretrainedError(f"--pretrained {path} holds a list of arrays without names; save a dict "
                              "(save_parameters or net.export)")
    return {key.split(":", 1)[-1]: value.astype("float32").asnumpy() for key, value in loaded.items()}
