"""The photo RecordIO the tools time and check pipelines on: crops of scikit-learn's two sample photographs,
resized to ImageNet-like 500x375 or 375x500, JPEG quality 90 (tools/bench_io.py, tools/gpu_check.py)."""
import os


def make_photo_rec(prefix, count, seed=0):
    import cv2
    import numpy as np
    import sklearn.datasets
    from mxnet import recordio
    folder = os.path.join(os.path.dirname(sklearn.datasets.__file__), "images")
    photos = [cv2.imread(os.path.join(folder, name)) for name in ("china.jpg", "flower.jpg")]
    rng = np.random.RandomState(seed)
    writer = recordio.MXIndexedRecordIO(prefix + ".idx.tmp", prefix + ".rec.tmp", "w")
    for i in range(count):
        photo = photos[i % 2]
        h, w = rng.randint(250, 427), rng.randint(300, 640)
        y, x = rng.randint(0, 428 - h), rng.randint(0, 641 - w)
        size = (500, 375) if rng.rand() < 0.75 else (375, 500)  # mostly landscape, like ImageNet
        image = cv2.resize(photo[y:y + h, x:x + w], size, interpolation=cv2.INTER_AREA)
        if rng.rand() < 0.5:
            image = image[:, ::-1]
        jpeg = cv2.imencode(".jpg", np.ascontiguousarray(image), [cv2.IMWRITE_JPEG_QUALITY, 90])[1]
        writer.write_idx(i, recordio.pack(recordio.IRHeader(0, float(i % 10), i, 0), jpeg.tobytes()))
    writer.close()
    os.replace(prefix + ".rec.tmp", prefix + ".rec")
    os.replace(prefix + ".idx.tmp", prefix + ".idx")
