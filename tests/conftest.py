"""pytest's hooks and the fixtures tests of more than one file share (tests/unit: the in-process tests, by module;
tests/e2e: launches and trainings, by journey). The helpers are in tests/support, a module per purpose; pytest.ini
puts the repository, tools/ and tests/ on the path. Nothing here imports MXNet: a fixture imports what it builds
with when it runs."""
import random
import signal
import sys

import numpy as np
import pytest

from rn50kit.common import supported
from support import datasets


class _MXNetLoadsAsInTheKit:
    """MXNet loads in the tests' processes as in the kit's (train.py's import_mxnet): without scikit-learn, SciPy and
    onnx while its package initialises (importlib's ``_initializing``), whichever test file imports it first; 2 s
    of each pytest process. Anything else imports them as usual."""
    @staticmethod
    def find_spec(name, path=None, target=None):
        mxnet = sys.modules.get("mxnet")
        if mxnet is not None and getattr(getattr(mxnet, "__spec__", None), "_initializing", False):
            return supported.WithoutUnusedLibraries.find_spec(name, path, target)
        return None


sys.meta_path.insert(0, _MXNetLoadsAsInTheKit)


@pytest.fixture(autouse=True)
def same_random_state():
    """Each test starts from the same random state of Python, numpy and MXNet, whatever ran before it in its process
    (pytest-xdist's workers take the files in any order): its random weights and data do not depend on that. MXNet
    is seeded where a test file has imported it (a fresh import starts from that same seed)."""
    random.seed(0)
    np.random.seed(0)
    if "mxnet" in sys.modules:
        sys.modules["mxnet"].random.seed(0)


@pytest.fixture()
def keep_signal_handlers():
    """stop_signals.StopFlag installs handlers for SIGTERM, SIGUSR1 and SIGINT: put pytest's back after the test."""
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT)}
    yield
    for sig, handler in saved.items():
        signal.signal(sig, handler)


def pytest_configure(config):
    """Ctrl-C reaches what the tests start, as from a terminal. A shell without job control (a CI job's
    ``.ci/run &``) starts its background commands with SIGINT ignored, and that is inherited down to every process
    the tests start: benchmark.py, which relies on Python's KeyboardInterrupt, would ignore the SIGINT a test sends
    it (a 600 s hang in one CI trial). Python's own handler here becomes the default again in each child."""
    signal.signal(signal.SIGINT, signal.default_int_handler)


# The files that take longest, longest first (CI's durations): pytest-xdist hands out whole files in the order
# collected (`make test` turns off its own reordering by the number of tests, which started the covering campaign
# and the fine-tuning test last), and a long file started late leaves the other workers idle at the end; the unit
# files, collected after these, fill that end. test_pretrained: a fifth of the fast lane.
LONGEST_FIRST = ("test_fault_recovery.py", "test_docs.py", "test_elastic_training.py", "test_benchmark_sweeps.py",
                 "test_fault_campaign.py", "test_train_and_resume.py", "test_horovod_training.py",
                 "test_config_files_cli.py", "test_int8.py", "test_finetune.py", "test_self_check.py",
                 "test_launchers.py", "test_kill_at_every_write.py", "test_pretrained.py")


def pytest_collection_modifyitems(items):
    """Tests on the digits dataset are slow: it is built through im2rec (tens of seconds, once per session)."""
    for item in items:
        if "digits_data" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.slow)
    first = {name: rank for rank, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: first.get(item.path.name, len(first)))  # stable: the others keep their order


# --- datasets ----------------------------------------------------------------------------------------------------

@pytest.fixture(scope="session")
def digits_data(tmp_path_factory):
    """The demo dataset (real digit scans), built through tools/make_demo_data.py and im2rec, once per test run."""
    with datasets.made_once(tmp_path_factory, "digits") as (out, to_make):
        if to_make:
            datasets.make_digits(out)
    return out


@pytest.fixture(scope="session")
def unique_label_rec(tmp_path_factory):
    """A RecordIO whose labels are the record numbers, so each sample can be told apart: (rec, idx, count)."""
    rec, idx = datasets.unique_label_records(tmp_path_factory.mktemp("unique"))
    return rec, idx, datasets.UNIQUE_COUNT


@pytest.fixture(scope="module")
def sorted_rec(tmp_path_factory):
    """datasets.sorted_records: 64 small JPEGs stored in label order (unit/test_records, e2e/test_data_pipelines)."""
    return datasets.sorted_records(tmp_path_factory.mktemp("sorted"))


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    """datasets.planted_records: a record file with one of each fault check_dataset.py finds."""
    return datasets.planted_records(tmp_path_factory.mktemp("planted"))


@pytest.fixture()
def data_folder(tmp_path):
    """A data root of empty record files (tmp_path/data), for plans that only look at the file names."""
    folder = tmp_path / "data"
    folder.mkdir()
    return datasets.empty_records(folder)


@pytest.fixture()
def data_root(tmp_path):
    """The test's own folder holding empty record files, for plans that only look at the file names."""
    return datasets.empty_records(tmp_path)


# --- published weights: each a ResNet's worth of numpy arrays and its reference logits, built once for every file
# (unit/test_pretrained, e2e/test_published_weights, interop_pretrained.py)

@pytest.fixture(scope="session")
def tv18(tmp_path_factory):
    from support.weights import Weights, save_safetensors
    weights = Weights(tmp_path_factory.mktemp("tv18"), "resnet18", 18, 7, seed=0)
    save_safetensors(weights.sd, weights.path(".safetensors"))
    return weights


@pytest.fixture(scope="session")
def tv50(tmp_path_factory):
    from support.weights import Weights, save_safetensors
    weights = Weights(tmp_path_factory.mktemp("tv50"), "resnet50", 50, 7, seed=1)
    save_safetensors(weights.sd, weights.path(".safetensors"))
    return weights


@pytest.fixture(scope="session")
def resnext50(tmp_path_factory):
    from support.weights import Weights
    return Weights(tmp_path_factory.mktemp("rx50"), "resnext50_32x4d", 50, 5, seed=3, groups=32, width_per_group=4)
