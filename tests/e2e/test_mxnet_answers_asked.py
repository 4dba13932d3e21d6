"""What runner's launch check asks of MXNet, answered by a Python that imports train (hardware/mxnet_answers.py): the
network's sizes of a CPU run's memory estimate, NVIDIA's fused BatchNorm; the check loads no MXNet once they are
known."""
import json
import subprocess
import sys

import pytest

from rn50kit.hardware import mxnet_answers
from support.processes import ROOT, venv_env
from support.runs import TINY_RUN, configured


@pytest.fixture(scope="module")
def measured_cache(tmp_path_factory):
    """A cache holding TINY_RUN's network, measured once (about 3 s) by the kit's own path."""
    path = tmp_path_factory.mktemp("cache") / "network-sizes.json"
    sizes = mxnet_answers.network_sizes(configured(TINY_RUN), TINY_RUN, path=str(path))
    return path, sizes


def test_the_measured_sizes_are_those_of_the_network_built_here(measured_cache):
    """One process against another: the sizes the measuring Python printed are this process's count of the
    network train.py builds from the same flags."""
    import mxnet as mx

    from rn50kit.hardware import memory
    from rn50kit.training import network
    net = network.build_network(configured(TINY_RUN), [mx.cpu()], amp_graph=False)
    assert measured_cache[1] == (memory.parameter_count(net), memory.activation_elements(net, (1, 3, 32, 32)))
    assert list(json.loads(measured_cache[0].read_text()).values()) == [dict(zip(("parameters", "activations"),
                                                                                 measured_cache[1]))]


def test_runner_s_launch_check_loads_no_mxnet_once_the_network_is_known(measured_cache, tmp_path):
    """The launch check of a CPU run, the memory estimate included, in a Python that must not load MXNet."""
    cache = tmp_path / "rn50-kit"
    cache.mkdir()
    (cache / "mxnet-answers.json").write_text(measured_cache[0].read_text())
    code = ("import sys; from rn50kit.launch import train_flags; "
            "prefix = train_flags.check_train_flags(sys.argv[1:], {'gpus': 0, 'workers': 2, 'workers_here': 2, "
            "'memory': True}); print(prefix, 'mxnet' in sys.modules)")
    env = {**venv_env(), "XDG_CACHE_HOME": str(tmp_path)}
    done = subprocess.run([sys.executable, "-c", code, *TINY_RUN, "--batch-size", "16", "--workspace",
                           str(tmp_path / "ws")], cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True)
    assert done.returncode == 0 and done.stdout.split() == [str(tmp_path / "ws" / "model"), "False"]
    refused = subprocess.run([sys.executable, "-c", code, *TINY_RUN, "--batch-size", "10000000"], cwd=ROOT, env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert refused.returncode == 2 and refused.stderr.startswith("train.py: error: training needs about")


def test_the_fused_batchnorm_answer_is_this_mxnet_s(tmp_path):
    """Asked by a float16 run on GPUs (its defaults), as in a dry run of `./runner -n 8 -b 208 --dtype float16`
    planned for 8 GPUs: this MXNet's own answer, and runner's check then loads no MXNet."""
    from rn50kit.hardware import devices
    path = tmp_path / "rn50-kit" / "mxnet-answers.json"
    assert mxnet_answers.nvidia_fused_batchnorm(str(path)) is (devices.nvidia_bn_relu() and
                                                               devices.nvidia_bn_add_relu())
    assert list(json.loads(path.read_text()).values()) == [{"fused": mxnet_answers.nvidia_fused_batchnorm(str(path))}]
    code = ("import sys; from rn50kit.launch import train_flags; train_flags.check_train_flags(sys.argv[1:], "
            "{'gpus': 8, 'workers': 8, 'workers_here': 8, 'memory': False}); print('mxnet' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code, *TINY_RUN, "--dtype", "float16", "--batch-size", "1664",
                           "--workspace", str(tmp_path / "ws")], cwd=ROOT, env={**venv_env(), "XDG_CACHE_HOME":
                                                                               str(tmp_path)},
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert done.returncode == 0 and done.stdout.split() == ["False"], done.stderr


def test_runner_s_check_of_a_load_file_reads_it_through_mxnet_without_loading_it(tmp_path):
    """A scoring launch's --load with no state file beside it: a damaged file refused in train.py's line, a whole one
    passed, and runner's process never loads MXNet."""
    import mxnet as mx
    whole, damaged = tmp_path / "whole.params", tmp_path / "damaged.params"
    mx.nd.save(str(whole), {"w": mx.nd.ones((2, 3))})
    damaged.write_bytes(whole.read_bytes()[:-5])
    code = ("import sys; from rn50kit.launch import train_flags; "
            "train_flags.check_train_flags(sys.argv[1:], {'gpus': 0, 'workers': 1, 'workers_here': 1, "
            "'memory': True}); print('mxnet' in sys.modules)")
    for path, status in ((whole, 0), (damaged, 2)):
        done = subprocess.run([sys.executable, "-c", code, *TINY_RUN, "--mode", "val", "--load", str(path)], cwd=ROOT,
                              env=venv_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert done.returncode == status, done.stderr
        if status:
            assert done.stderr == f"train.py: error: {damaged} is damaged or not a parameter file " \
                f"({done.stderr.split('(', 1)[1]}"
            assert done.stderr.count("\n") == 1
        else:
            assert done.stdout.split() == ["False"]
