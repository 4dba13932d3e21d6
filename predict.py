"""--mode pred: the top-5 classes of one image, through the validation transform, with class names."""
import dataclasses
import logging
import os

import mxnet as mx
import numpy as np

import cli
from data import out_dtype

log = logging.getLogger("rn50")


class PredictionError(Exception):
    """An image that cannot be read: reported as one line."""


@dataclasses.dataclass(frozen=True)
class PredictConfig:
    """The Prediction flags' values."""
    data_pred: str = None
    class_names: str = None


def add_pred_args(parser):
    group = parser.add_argument_group("Prediction", "--mode pred")
    group.add_argument("--data-pred", help="pred: image file to classify")
    group.add_argument("--class-names",
                       help="pred: file with one class name per line (default: class folders from the .lst "
                            "beside --data-train, else class indices)")
    parser.set_defaults(**cli.config_defaults(PredictConfig))
    return group


def check_pred_args(data_pred):
    """Raise ValueError unless --data-pred names an existing file."""
    if not data_pred:
        raise ValueError("--mode pred needs an image: --data-pred IMAGE")
    if not os.path.isfile(data_pred):
        raise ValueError(f"--data-pred {data_pred} does not exist")


def class_names(names_file, data_train):
    """Class names from ``names_file`` (--class-names), else the class folders in the .lst beside ``data_train``,
    else None."""
    if names_file:
        with open(names_file) as f:
            return [line.strip() for line in f if line.strip()]
    candidates = []
    if data_train:
        candidates.append(os.path.splitext(data_train)[0] + ".lst")
        candidates.append(os.path.join(os.path.dirname(data_train), "train.lst"))
    for lst in candidates:
        if os.path.isfile(lst):
            names = {}
            with open(lst) as f:
                for line in f:  # im2rec: index \t label \t relative/path
                    parts = line.rstrip("\n").split("\t")
                    if len(parts) >= 3:
                        names[int(float(parts[1]))] = parts[-1].replace("\\", "/").split("/")[0]
            return [names.get(i, str(i)) for i in range(max(names) + 1)] if names else None
    return None


def load_image(path, image_shape, resize, mean, std, layout):
    """The validation transform: shorter side to ``resize``, centre crop to ``image_shape`` (C,H,W; C=4 adds a
    zero channel), normalise by ``mean``/``std`` (RGB), in ``layout``; a batch of one."""
    import cv2
    image = cv2.imread(path, cv2.IMREAD_COLOR)
    if image is None:
        raise PredictionError(f"--data-pred {path} is not a readable image")
    image = cv2.cvtColor(image, cv2.COLOR_BGR2RGB)
    channels, height, width = image_shape
    h, w = image.shape[:2]
    scale = resize / min(h, w)
    image = cv2.resize(image, (max(width, round(w * scale)), max(height, round(h * scale))),
                       interpolation=cv2.INTER_LINEAR)
    top, left = (image.shape[0] - height) // 2, (image.shape[1] - width) // 2
    image = image[top:top + height, left:left + width].astype("float32")
    image = (image - np.array(mean, "float32")) / np.array(std, "float32")
    if channels == 4:
        image = np.concatenate([image, np.zeros_like(image[..., :1])], axis=-1)
    if layout == "NCHW":
        image = image.transpose(2, 0, 1)
    return image[None]


def predict(net, image, ctx, dtype, names=None, top=5):
    """Print the ``top`` classes of ``image`` (a load_image batch) by ``net`` (weights loaded); returns
    [(probability, class index, name)]."""
    batch = mx.nd.array(image, ctx=ctx).astype(out_dtype(dtype))
    probs = net(batch).astype("float32").softmax()[0].asnumpy()
    if names is None:
        log.info("No class names (--class-names, or a .lst beside --data-train): printing class indices")
    elif len(names) != len(probs):
        log.warning("%d class names (--class-names, or the .lst beside --data-train) for a network of %d classes: "
                    "the names may not be the classes'; give one name per class, in label order", len(names),
                    len(probs))
    result = []
    for rank, index in enumerate(np.argsort(-probs)[:top], 1):
        name = names[index] if names and index < len(names) else str(index)
        print(f"{rank}. {100 * probs[index]:6.2f}% -> {name}")
        result.append((float(probs[index]), int(index), name))
    return result
