"""What runner's launch check asks of MXNet, answered by a Python that imports train (launch/mxnet_answers.py): the
network's sizes of a CPU run's memory estimate, NVIDIA's fused BatchNorm; the check loads no MXNet once they are
known."""
import json
import subprocess
import sys

import pytest

from rn50kit.launch import mxnet_answers
from support.processes import ROOT, venv_env

ARGV = ["--data-backend", "synthetic", "--num-layers", "18", "--num-classes", "10", "--image-shape", "3,32,32"]


def run_config(argv):
    from rn50kit.config import train_flags
    return train_flags.configure(train_flags.parse_args(argv), train_flags.given_flags(argv), 0)


@pytest.fixture(scope="module")
def measured_cache(tmp_path_factory):
    """A cache holding ARGV's network, measured once (about 3 s) by the kit's own path."""
    path = tmp_path_factory.mktemp("cache") / "network-sizes.json"
    sizes = mxnet_answers.network_sizes(run_config(ARGV), ARGV, path=str(path))
    return path, sizes


def test_the_measured_sizes_are_those_of_the_network_built_here(measured_cache):
    """One process against another: the sizes the measuring Python printed are this process's count of the
    network train.py builds from the same flags."""
    import mxnet as mx

    from rn50kit.launch import memory
    from rn50kit.training import network
    net = network.build_network(run_config(ARGV), [mx.cpu()], amp_graph=False)
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
    done = subprocess.run([sys.executable, "-c", code, *ARGV, "--batch-size", "16", "--workspace",
                           str(tmp_path / "ws")], cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True)
    assert done.returncode == 0 and done.stdout.split() == [str(tmp_path / "ws" / "model"), "False"]
    refused = subprocess.run([sys.executable, "-c", code, *ARGV, "--batch-size", "10000000"], cwd=ROOT, env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert refused.returncode == 2 and refused.stderr.startswith("train.py: error: training needs about")


def test_the_fused_batchnorm_answer_is_this_mxnet_s(tmp_path):
    from rn50kit.launch import devices
    path = str(tmp_path / "answers.json")
    assert mxnet_answers.nvidia_fused_batchnorm(path) is (devices.nvidia_bn_relu() and devices.nvidia_bn_add_relu())
    assert list(json.loads(open(path).read()).values()) == [{"fused": mxnet_answers.nvidia_fused_batchnorm(path)}]
