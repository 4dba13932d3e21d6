"""A workspace on a file system without locks (Lustre mounted without flock, NFS without lockd): training warns
that nothing stops a second run there and goes on. Found by the house's third step: the warning read an undefined
name, so rank 0 died of a NameError instead. The file system is made lockless for real: an LD_PRELOAD shim makes
libc's flock() fail with ENOLCK, as such a mount does."""
import errno
import os
import shutil
import subprocess
import sys

import pytest

from support.processes import HANG_S, ROOT, venv_env

SHIM = """#include <errno.h>
int flock(int fd, int operation) { (void)fd; (void)operation; errno = ENOLCK; return -1; }
"""


@pytest.fixture(scope="module")
def no_flock_shim(tmp_path_factory):
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        if os.environ.get("CI"):
            pytest.fail("CI has no C compiler for the flock shim (apt-get install gcc)")
        pytest.skip("no C compiler (cc/gcc) to build the flock shim: apt-get install gcc")
    folder = tmp_path_factory.mktemp("shim")
    (folder / "noflock.c").write_text(SHIM)
    library = folder / "libnoflock.so"
    subprocess.run([compiler, "-shared", "-fPIC", "-o", str(library), str(folder / "noflock.c")], check=True,
                   timeout=HANG_S)
    return library


@pytest.mark.slow  # builds and loads a C shim in subprocesses
def test_the_shim_really_takes_locks_away(no_flock_shim, tmp_path):
    """The reference: under the shim Python's own fcntl.flock fails with ENOLCK, without it the lock is taken."""
    probe = ("import fcntl, os, sys\nfd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT)\n"
             "try:\n    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB); print('locked')\n"
             "except OSError as e:\n    print(e.errno)")
    env = dict(venv_env(), LD_PRELOAD=str(no_flock_shim))
    shimmed = subprocess.run([sys.executable, "-c", probe, str(tmp_path / "f")], env=env, capture_output=True,
                             text=True, timeout=HANG_S)
    plain = subprocess.run([sys.executable, "-c", probe, str(tmp_path / "f")], env=venv_env(), capture_output=True,
                           text=True, timeout=HANG_S)
    assert shimmed.stdout.strip() == str(errno.ENOLCK) and plain.stdout.strip() == "locked"


@pytest.mark.slow  # trains a small network for an epoch
def test_training_on_a_file_system_without_locks_warns_and_finishes(no_flock_shim, tmp_path):
    workspace = tmp_path / "ws"
    env = dict(venv_env(), LD_PRELOAD=str(no_flock_shim))
    result = subprocess.run(
        [sys.executable, os.path.join(ROOT, "train.py"), "--data-backend", "synthetic", "--num-layers", "18",
         "--num-classes", "3", "--image-shape", "3,32,32", "--batch-size", "8", "--num-examples", "16",
         "--num-epochs", "1", "--workspace", str(workspace)],
        env=env, capture_output=True, text=True, timeout=HANG_S)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "NameError" not in result.stderr and "Traceback" not in result.stderr
    assert f"The file system of {workspace} has no locks" in result.stderr
    assert (workspace / "model-0001.params").is_file()
