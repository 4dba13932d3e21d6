"""The data: the dali-cpu validation batch against OpenCV's, and the dali-gpu and dali-cpu batches that reach MXNet
on the GPU against dali-cpu's on the CPU."""
import os

from rn50kit.benchmarking import photos

PIXEL_TOLERANCE = 4.0  # mean absolute difference, in 0..255 pixel units (decoders and resize filters differ)


def validation_records(machine, args):
    if args.data_val:
        idx = os.path.splitext(args.data_val)[0] + ".idx"
        return args.data_val, idx
    prefix = os.path.join(machine.workdir, "photos")
    photos.make_photo_rec(prefix, 16)
    return prefix + ".rec", prefix + ".idx"


MEAN, STD = (123.68, 116.779, 103.939), (58.393, 57.12, 57.375)


def dali_batch(rec, idx, device, ctx, dtype="float32", layout="NCHW", channels=3, batch=8, normalize="auto"):
    """The first batch of the validation pipeline on ``device`` ("cpu"/"gpu"), through DaliBatches to ``ctx``
    (normalized where --dali-normalize ``normalize`` puts it, as rn50kit/data/backend_dali.py builds it), as
    float32 NCHW 3-channel numpy, with its labels."""
    import dali
    on_device = dali.normalizes_on_device(normalize, device, ctx)
    shape = (channels, 224, 224)
    pipe = dali.val_pipeline(rec_path=rec, idx_path=idx, shard_id=0, num_shards=1, image_shape=shape, mean=MEAN,
                             std=STD, dtype=dtype, layout=layout, device=device, resize_shorter=256, batch_size=batch,
                             num_threads=2, device_id=ctx.device_id if device == "gpu" else None, seed=1,
                             normalize=not on_device)
    pipe.build()
    after = dali.DeviceNormalize(shape, MEAN, STD, dtype, layout) if on_device else None
    images, labels = dali.DaliBatches(pipe, ctx, normalize=after).next()
    where = (str(images.context), str(images.dtype.__name__ if hasattr(images.dtype, "__name__") else images.dtype),
             images.shape)
    out = images.asnumpy().astype("float32")
    if layout == "NHWC":
        out = out.transpose(0, 3, 1, 2)
    return out[:, :3], labels.asnumpy(), where


def pixel_error(a, b):
    import numpy as np
    return float((np.abs(a - b) * np.array(STD, "float32")[None, :, None, None]).mean())


def opencv_reference(rec, idx, count):
    """The validation transform by OpenCV: shorter side to 256 (area filter), centre crop 224, normalize."""
    import cv2
    import numpy as np
    from mxnet import recordio
    reader = recordio.MXIndexedRecordIO(idx, rec, "r")
    out = []
    for i in sorted(reader.keys)[:count]:
        _, payload = recordio.unpack(reader.read_idx(i))
        rgb = cv2.imdecode(np.frombuffer(payload, np.uint8), cv2.IMREAD_COLOR)[:, :, ::-1].astype("float32")
        h, w = rgb.shape[:2]
        scale = 256 / min(h, w)
        nh, nw = int(h * scale + 0.5), int(w * scale + 0.5)
        resized = cv2.resize(rgb, (nw, nh), interpolation=cv2.INTER_AREA)
        y0, x0 = (nh - 224 + 1) // 2, (nw - 224 + 1) // 2
        crop = (resized[y0:y0 + 224, x0:x0 + 224] - np.array(MEAN, "float32")) / np.array(STD, "float32")
        out.append(crop.transpose(2, 0, 1))
    reader.close()
    return np.stack(out)


def check_data_cpu(machine, args):
    import mxnet as mx
    rec, idx = validation_records(machine, args)
    images, _, where = dali_batch(rec, idx, "cpu", mx.cpu())
    error = pixel_error(images, opencv_reference(rec, idx, images.shape[0]))
    found = {"records": rec, "mean_abs_pixel_error": error, "tolerance": PIXEL_TOLERANCE, "batch": str(where)}
    return ("pass" if error <= PIXEL_TOLERANCE else "fail"), (
        f"dali-cpu validation batch vs OpenCV on {os.path.basename(rec)}: {error:.2f} (mean absolute, 0-255 units; "
        f"tolerance {PIXEL_TOLERANCE:g})"), found


def check_data_gpu(machine, args):
    """dali-gpu (nvJPEG), dali-cpu's uint8 crops normalized on the GPU (its default for a GPU) and dali-cpu
    normalized in the pipeline, staged through pinned memory, all into MXNet on gpu(0) as float16 NHWC 4-channel
    batches, against dali-cpu on the CPU."""
    import mxnet as mx
    rec, idx = validation_records(machine, args)
    reference, labels, _ = dali_batch(rec, idx, "cpu", mx.cpu())
    found, worst, parts = {"records": rec}, 0.0, []
    for name, device, normalize in [("dali-gpu", "gpu", "auto"), ("dali-cpu", "cpu", "auto"),
                                    ("dali-cpu --dali-normalize pipeline", "cpu", "pipeline")]:
        images, got_labels, where = dali_batch(rec, idx, device, mx.gpu(0), "float16", "NHWC", 4,
                                               normalize=normalize)
        error = pixel_error(images, reference)
        same_labels = bool((got_labels == labels).all())
        found[name] = {"mean_abs_pixel_error": error, "batch": str(where), "labels_equal": same_labels}
        worst = max(worst, error if same_labels else float("inf"))
        parts.append(f"{name} -> {where[0]} {where[1]} {tuple(where[2])}: {error:.2f}")
    summary = f"vs dali-cpu on the CPU (mean absolute, 0-255 units, tolerance {PIXEL_TOLERANCE:g}): " + "; ".join(parts)
    return ("pass" if worst <= PIXEL_TOLERANCE else "fail"), summary, found
