"""--test-io: iterate the chosen data pipeline alone (no network), report images/s, and save its first batch as a
grid of images (--test-io-grid)."""
import math
import time

import numpy as np

from rn50kit.data.protocol import DataError


def save_image_grid(images, path, mean, std, layout="NCHW", columns=8):
    """Write a batch (N images, normalised, NCHW or NHWC, 3 or 4 channels: the 4th is padding) as one PNG grid,
    ``columns`` images a row, pixels un-normalised (x * std + mean) to 0-255. Returns the grid (RGB, uint8)."""
    import cv2
    batch = images.asnumpy() if hasattr(images, "asnumpy") else np.asarray(images)
    batch = batch.astype(np.float32)
    if layout == "NCHW":
        batch = batch.transpose(0, 2, 3, 1)
    batch = batch[..., :3] * np.asarray(std, np.float32) + np.asarray(mean, np.float32)
    batch = np.clip(np.rint(batch), 0, 255).astype(np.uint8)
    count, height, width, _ = batch.shape
    columns = min(columns, count)
    rows = math.ceil(count / columns)
    grid = np.zeros((rows * height, columns * width, 3), np.uint8)
    for i, image in enumerate(batch):
        row, column = divmod(i, columns)
        grid[row * height:(row + 1) * height, column * width:(column + 1) * width] = image
    if not cv2.imwrite(path, grid[:, :, ::-1]):  # OpenCV writes BGR
        raise DataError(f"--test-io-grid {path}: cannot write a PNG there")
    return grid


def test_io(run_cfg, train_iter, val_iter, dist=None, epochs=1, out=print):
    """Iterate the chosen iterator only (no network) for ``epochs`` epochs and report images/s.

    Every batch is waited for, so a GPU pipeline is timed to the end of its copy. The first batch (pipeline
    start-up, prefetch fill) is excluded from the rate. With ``dist`` the images of all ranks are summed.
    Returns {"images": ..., "seconds": ..., "images_per_sec": ...} for this rank's share.
    """
    mode, disp_batches = run_cfg.data.test_io_mode, run_cfg.fit.disp_batches
    iterator = train_iter if mode == "train" else val_iter
    if iterator is None:
        raise ValueError(f"--test-io-mode {mode} needs --data-{mode}")
    primary = dist is None or dist.is_primary
    images, start, steps = 0, None, len(iterator) * epochs
    step = 0
    for _ in range(epochs):
        for batch in iterator:
            for array in batch.data + batch.label:  # one per device with --kv-store device
                array.wait_to_read()
            step += 1
            if start is None:
                if run_cfg.data.test_io_grid and primary:
                    cfg = run_cfg.data
                    save_image_grid(batch.data[0], cfg.test_io_grid, cfg.rgb_mean, cfg.rgb_std, cfg.input_layout)
                    out(f"test-io: saved the first {mode} batch as {cfg.test_io_grid}")
                start = time.time()  # timing starts after the first batch
                continue
            images += sum(data.shape[0] for data in batch.data) - batch.pad
            if primary and disp_batches and step % disp_batches == 0:
                rate = images / max(time.time() - start, 1e-9)
                eta = (steps - step) * batch.data[0].shape[0] / max(rate, 1e-9)
                out(f"test-io {mode} [{step}/{steps}] {rate:.1f} img/s (this rank), ETA {eta:.0f} s")
    seconds = time.time() - start if start is not None else 0.0
    total = images
    if dist is not None:
        total = dist.sum([images], "test_io.images")[0]
    rate = total / max(seconds, 1e-9)
    if primary:
        out(f"test-io {mode} backend {run_cfg.data.data_backend}: {int(total)} images in {seconds:.2f} s, "
            f"{rate:.1f} images/s")
    return {"images": total, "seconds": seconds, "images_per_sec": rate}
