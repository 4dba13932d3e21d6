"""rn50kit/data/images.py: one judge of an image for the packer (tools/prepare_folder.py) and for prediction
(--mode pred's rows): a GIF and a truncated JPEG are refused by both, with the same reason."""
import functools
import io

import cv2
import numpy as np
import prepare_folder
from PIL import Image

from rn50kit.data import images
from rn50kit.scoring import predict, predict_many


def photos_with_refused_ones(root):
    root.mkdir()
    ok, jpeg = cv2.imencode(".jpg", np.random.RandomState(0).randint(0, 255, (40, 50, 3), dtype=np.uint8))
    (root / "good.jpg").write_bytes(jpeg.tobytes())
    (root / "cut.jpg").write_bytes(jpeg.tobytes()[:len(jpeg) // 2])  # OpenCV decodes it with only a warning
    gif = io.BytesIO()
    Image.fromarray(np.zeros((20, 20, 3), np.uint8)).save(gif, "GIF")
    (root / "anim.gif").write_bytes(gif.getvalue())
    return root


def test_prediction_and_the_packer_refuse_the_same_images_for_the_same_reason(tmp_path):
    """Issue 58: --data-pred passed GIFs over without a word and predicted a truncated JPEG."""
    root = photos_with_refused_ones(tmp_path / "photos")
    paths = predict_many.image_paths(str(root))
    assert [p.rsplit("/", 1)[1] for p in paths] == ["anim.gif", "cut.jpg", "good.jpg"]  # the GIF is listed
    transform = functools.partial(predict.load_image, image_shape=(3, 32, 32), resize=32, mean=(0, 0, 0),
                                  std=(1, 1, 1), layout="NCHW")
    predicted = {path.rsplit("/", 1)[1]: error for path, _, error in predict_many.loaded(paths, transform)}
    packed = {}
    for name in ("anim.gif", "cut.jpg", "good.jpg"):
        _, errors, _, _ = prepare_folder.check_image((str(root), name))
        packed[name] = "; ".join(f"{kind}: {detail}" for kind, detail in errors) or None
    assert predicted == packed
    assert predicted["good.jpg"] is None and predicted["cut.jpg"].startswith("truncated image: JPEG of ")
    assert predicted["anim.gif"].startswith("unsupported image: GIF")


def test_the_record_checker_judges_a_payload_as_a_file(tmp_path):
    import check_dataset
    root = photos_with_refused_ones(tmp_path / "photos")
    for name in ("anim.gif", "cut.jpg", "good.jpg"):
        data = (root / name).read_bytes()
        payload = check_dataset.IR_HEADER.pack(0, 1.0, 0, 0) + data
        errors, warnings, _ = check_dataset.check_payload(payload, 2, (1, 100, 10.0))
        assert (errors, warnings) == images.judge_image(data, (1, 100, 10.0))[:2]
