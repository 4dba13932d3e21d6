"""A training start does not read the data set: after a 2-iteration start on a record set spaced like ImageNet's
(20,000 records 110 KiB apart, a 2.3 GB sparse file, evicted from the page cache first) at most 5 % of train.rec
is in the page cache (the index check used to bring in all of it). The page cache is measured with mincore(2)
(tools/bench_startup.py) and checked against util-linux's fincore where it is installed."""
import mmap
import os
import shutil

import bench_startup
import pytest

from support.processes import HANG_S, run, venv_env

pytestmark = pytest.mark.slow  # launches train.py
PAGE = mmap.PAGESIZE


def test_a_two_iteration_start_leaves_at_most_5_percent_of_train_rec_in_memory(tmp_path):
    rec = bench_startup.build(str(tmp_path / "imagenet-spaced"), 20000)
    size = os.path.getsize(rec)
    bench_startup.evict(rec)
    if bench_startup.cached_bytes(rec):
        pytest.skip(f"this file system keeps {rec} in memory after posix_fadvise DONTNEED (tmpfs?)")
    seconds, peak_mb = bench_startup.run_train(rec, str(tmp_path / "run"))
    cached = bench_startup.cached_bytes(rec)
    assert 0 < cached <= 0.05 * size, f"{cached / 1e6:.1f} MB of {size / 1e6:.0f} MB in the page cache"
    if shutil.which("fincore"):
        out = run(["fincore", "--bytes", "--noheadings", "--output", "RES", rec], env=venv_env(), timeout=HANG_S)
        assert int(out.stdout.split()[0]) == cached, out.stdout


def test_cached_bytes_counts_the_pages_read(tmp_path):
    path = tmp_path / "file"
    path.write_bytes(os.urandom(64 * PAGE))
    bench_startup.evict(str(path))
    if bench_startup.cached_bytes(str(path)):
        pytest.skip("this file system keeps files in memory after posix_fadvise DONTNEED (tmpfs?)")
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(descriptor, 0, 0, os.POSIX_FADV_RANDOM)  # the pages asked for, no read-ahead
        os.pread(descriptor, 10, 5 * PAGE)
        os.pread(descriptor, PAGE, 40 * PAGE)
    finally:
        os.close(descriptor)
    assert bench_startup.cached_bytes(str(path)) == 2 * PAGE
