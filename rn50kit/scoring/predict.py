"""--mode pred: the top-5 classes of one image, through the validation transform, with class names."""
import logging
import os

import mxnet as mx
import numpy as np

from rn50kit.config import cli
from rn50kit.config.scoring_flags import LIST_SUFFIXES, check_pred_args, is_glob  # noqa: F401  (read as predict.*)
from rn50kit.data.protocol import out_dtype
from rn50kit.weights import checkpoint

log = logging.getLogger("rn50")


class PredictionError(Exception):
    """An image that cannot be read: reported as one line; ``reason``, without the path, goes in a row's error
    column (predict_many)."""

    def __init__(self, message, reason=None):
        super().__init__(message)
        self.reason = reason or message


def read_names_file(path):
    """One class name per line (blank lines skipped), as tools/prepare_folder.py's classes.txt and
    imagenet_classes.py write them; a file that is not UTF-8 text is a UsageError (one line)."""
    with open(path, "rb") as f:
        lines = f.read().split(b"\n")
    for number, line in enumerate(lines, 1):
        try:
            line.decode()
        except UnicodeDecodeError as error:
            raise cli.UsageError(f"class names {path} line {number} is not UTF-8 text ({error.reason} at byte "
                                 f"{error.start}); give one class name per line, saved as UTF-8") from None
    return [line.decode().strip() for line in lines if line.decode().strip()]


def names_from_lst(lst):
    """The class folders of an im2rec .lst (index, label, relative/path; tab-separated), in label order; None when
    it has no entries."""
    from rn50kit.data.records import lst_classes  # parsed once per process: train.py's class-count check reads it
    names = lst_classes(lst)
    return [names.get(i, str(i)) for i in range(max(names) + 1)] if names else None


def dataset_class_names(*record_files):
    """The class names of a dataset, from beside its record files (the first that has them): classes.txt in the
    folder (tools/prepare_folder.py writes it), else the .lst beside the .rec, else the folder's train.lst (im2rec's
    class folders, as tools/prepare_imagenet.sh leaves them). None when none of them is there."""
    for rec in record_files:
        if not rec:
            continue
        folder = os.path.dirname(rec)
        names_txt = os.path.join(folder, "classes.txt")
        if os.path.isfile(names_txt):
            names = read_names_file(names_txt)
            if names:
                return names
        for lst in (os.path.splitext(rec)[0] + ".lst", os.path.join(folder, "train.lst")):
            if os.path.isfile(lst):
                names = names_from_lst(lst)
                if names:
                    return names
    return None


def readable(names):
    """``names`` for people: ImageNet's WordNet-id folders (n01440764...) become their ImageNet-1k names ("tench"),
    all of them or none; other names are kept."""
    if not names:
        return names
    from rn50kit.common import imagenet_classes
    if list(names) == list(imagenet_classes.SYNSETS):
        return imagenet_classes.names()
    by_id = dict(zip(imagenet_classes.SYNSETS, imagenet_classes.names()))
    if all(name in by_id for name in names):
        return [by_id[name] for name in names]
    return list(names)


def checkpoint_class_names(params_path):
    """The class names saved with a checkpoint (its state's "class_names", from the data it was trained on), or
    None."""
    if not params_path:
        return None
    state = checkpoint.trained_settings(params_path)
    names = state and state.get("class_names")
    return list(names) if names else None


def training_class_names(names_file, data_train, data_val, num_classes):
    """The names a training run saves in its checkpoints (as given or found: WordNet ids stay ids): --class-names,
    else the dataset's (dataset_class_names); None without names or when their number is not ``num_classes``."""
    names = read_names_file(names_file) if names_file else dataset_class_names(data_train, data_val)
    return names if names and len(names) == num_classes else None


def class_names(names_file, data_train, params_path=None, num_classes=None):
    """Class names for people, from the first source that has them: ``names_file`` (--class-names), the
    checkpoint ``params_path`` (the names of the data it was trained on), the dataset beside ``data_train``
    (dataset_class_names); ImageNet WordNet ids become ImageNet-1k names. None when there are none, or when
    ``num_classes`` is given and a saved or found list has another length."""
    if names_file:
        return readable(read_names_file(names_file))
    for names in (checkpoint_class_names(params_path), dataset_class_names(data_train)):
        if names and (num_classes is None or len(names) == num_classes):
            return readable(names)
    return None


def load_image(path, image_shape, resize, mean, std, layout):
    """The validation transform: shorter side to ``resize``, centre crop to ``image_shape`` (C,H,W; C=4 adds a
    zero channel), normalise by ``mean``/``std`` (RGB), in ``layout``; a batch of one."""
    import cv2

    from rn50kit.data.images import judge_image_file
    errors, _, info = judge_image_file(path, keep_decoded=True)  # as tools/prepare_folder.py judges it
    if errors:
        kind, detail = errors[0]
        raise PredictionError(f"--data-pred {path}: {kind}: {detail}", reason=f"{kind}: {detail}")
    image = cv2.cvtColor(info["decoded"], cv2.COLOR_BGR2RGB)
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


def softmax_batch(net, images, ctx, dtype):
    """The class probabilities (float32 numpy, one row per image) of a batch from load_image(s)."""
    batch = mx.nd.array(images, ctx=ctx).astype(out_dtype(dtype))
    return net(batch).astype("float32").softmax().asnumpy()


def warn_about_names(names, num_classes):
    if names is None:
        log.info("No class names (none saved with the checkpoint, no --class-names, no classes.txt or .lst beside "
                 "--data-train): printing class indices")
    elif len(names) != num_classes:
        log.warning("%d class names (--class-names, or the .lst beside --data-train) for a network of %d classes: "
                    "the names may not be the classes'; give one name per class, in label order", len(names),
                    num_classes)


def top_classes(probs, names, top):
    """[(probability, class index, name)] of the ``top`` most probable classes in ``probs`` (one image's)."""
    return [(float(probs[index]), int(index), names[index] if names and index < len(names) else str(index))
            for index in np.argsort(-probs, kind="stable")[:top]]


def predict(net, image, ctx, dtype, names=None, top=5):
    """Print the ``top`` classes of ``image`` (a load_image batch) by ``net`` (weights loaded); returns
    [(probability, class index, name)]."""
    probs = softmax_batch(net, image, ctx, dtype)[0]
    warn_about_names(names, len(probs))
    result = top_classes(probs, names, top)
    for rank, (probability, _, name) in enumerate(result, 1):
        print(f"{rank}. {100 * probability:6.2f}% -> {name}")
    return result
