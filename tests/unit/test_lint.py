"""The tree is lint-clean (ruff, pinned in setup.py, configured in pyproject.toml) and keeps the house's size
rule: no function over 80 lines in the kit, its tools and its tests."""
import ast
import functools
import os
import subprocess
import sys

import pytest

from support.processes import HANG_S, ROOT

MAX_FUNCTION_LINES = 80


@functools.lru_cache(maxsize=None)
def python_files():
    listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "*.py"], cwd=ROOT,
                            capture_output=True, text=True, timeout=HANG_S, check=True).stdout.split()
    return [os.path.join(ROOT, path) for path in listed + ["runner"] if os.path.isfile(os.path.join(ROOT, path))]


def test_ruff_finds_nothing():
    result = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "--output-format", "concise", ROOT],
                            cwd=ROOT, capture_output=True, text=True, timeout=HANG_S)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]



def test_ruff_reads_every_python_file_of_the_tree():
    """An exclusion in pyproject.toml that reaches too far (``"data"`` skipped rn50kit/data/ whole) would leave
    files unlinted while test_ruff_finds_nothing passes."""
    result = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "--show-files", ROOT], cwd=ROOT,
                            capture_output=True, text=True, timeout=HANG_S, check=True)
    read = {os.path.realpath(line.strip()) for line in result.stdout.splitlines() if line.strip()}
    unread = sorted(os.path.relpath(p, ROOT) for p in python_files() if os.path.realpath(p) not in read)
    assert len(read) > 100 and not unread, f"ruff skips: {unread[:10]}"


NODES = {}


def syntax_nodes(source, name):
    """Every node of ``source``'s syntax tree, parsed and walked once for all the rules here (they only read
    them): the tree's files cost one parse and one walk in the lane, not one a rule."""
    if source not in NODES:
        NODES[source] = list(ast.walk(ast.parse(source, name)))
    return NODES[source]


def long_functions(path):
    with open(path) as f:
        nodes = syntax_nodes(f.read(), path)
    for node in nodes:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            length = node.end_lineno - node.lineno + 1
            if length > MAX_FUNCTION_LINES:
                yield f"{os.path.relpath(path, ROOT)}:{node.lineno} {node.name} ({length} lines)"


def test_no_function_over_80_lines():
    found = [line for path in python_files() for line in long_functions(path)]
    assert not found, "split these: " + "; ".join(found)


def test_the_size_rule_sees_a_long_function(tmp_path):
    """The check itself: a function of 81 lines is found, one of 80 is not."""
    body = "\n".join(f"    x{i} = {i}" for i in range(79))
    (tmp_path / "long.py").write_text(f"def long():\n{body}\n    return 0\n")
    (tmp_path / "short.py").write_text(f"def short():\n{body}\n")
    assert [line.split(" ")[1] for line in long_functions(str(tmp_path / "long.py"))] == ["long"]
    assert not list(long_functions(str(tmp_path / "short.py")))


# --- nothing the kit loads can run code: no unpickling outside the converter of trusted old checkpoints ---------
UNPICKLING_ALLOWED = {"tools/convert_states.py"}  # says so in its doc: for files the user trusts
PICKLE_MODULES = {"pickle", "cPickle", "_pickle", "dill", "cloudpickle", "joblib"}
STATE_UNPICKLERS = {"load_states", "set_states"}  # MXNet's Trainer.load_states / Updater.set_states unpickle


def _keyword(call, name):
    return next((k.value for k in call.keywords if k.arg == name), None)


def _is_true(node):
    return isinstance(node, ast.Constant) and node.value is True


def unpickling(source, name="<source>"):
    """Where ``source`` loads a pickle: pickle.load(s)/Unpickler, torch.load without weights_only=True,
    np.load with allow_pickle, MXNet's load_states/set_states."""
    found = []
    for node in syntax_nodes(source, name):
        if isinstance(node, ast.ImportFrom) and node.module in PICKLE_MODULES and \
                any(a.name in ("load", "loads", "Unpickler") for a in node.names):
            found.append(f"{name}:{node.lineno} from {node.module} import load/loads/Unpickler")
        if isinstance(node, (ast.Attribute, ast.Name)) and (getattr(node, "attr", None) or getattr(node, "id", None)) \
                in STATE_UNPICKLERS:
            found.append(f"{name}:{node.lineno} {getattr(node, 'attr', None) or node.id} (unpickles)")
        if not (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)):
            continue
        module, attr = node.value.id, node.attr
        if module in PICKLE_MODULES and attr in ("load", "loads", "Unpickler"):
            found.append(f"{name}:{node.lineno} {module}.{attr}")
    for call in (n for n in syntax_nodes(source, name) if isinstance(n, ast.Call)):
        func = call.func
        if not (isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.attr == "load"):
            continue
        if func.value.id == "torch" and not _is_true(_keyword(call, "weights_only")):
            found.append(f"{name}:{call.lineno} torch.load without weights_only=True")
        allow = _keyword(call, "allow_pickle")
        if func.value.id in ("np", "numpy") and allow is not None and not \
                (isinstance(allow, ast.Constant) and allow.value is False):
            found.append(f"{name}:{call.lineno} np.load with allow_pickle")
    return found


def test_nothing_unpickles_outside_the_converter():
    found = [line for path in python_files() if os.path.relpath(path, ROOT) not in UNPICKLING_ALLOWED
             for line in unpickling(open(path).read(), os.path.relpath(path, ROOT))]
    assert not found, "these load pickles (only tools/convert_states.py may, for trusted files): " + "; ".join(found)


@pytest.mark.parametrize("source", [
    "import pickle\npickle.load(f)", "import pickle as p\npickle.loads(b)", "from pickle import loads",
    "class U(pickle.Unpickler): pass", "torch.load(path)", "torch.load(path, weights_only=False)",
    "np.load(path, allow_pickle=True)", "numpy.load(path, allow_pickle=flag)", "trainer.load_states(path)",
    "updater.set_states(data)", "import joblib\njoblib.load(path)"])
def test_the_unpickling_rule_sees_each_way(source):
    assert unpickling(source)


@pytest.mark.parametrize("source", [
    "torch.load(path, map_location='cpu', weights_only=True)", "np.load(path)", "np.load(path, allow_pickle=False)",
    "mx.nd.load(path)", "json.load(f)", "pickle.dumps(x)", "trainer.save_states(path)"])
def test_the_unpickling_rule_lets_safe_loads_pass(source):
    assert not unpickling(source)


MAX_MODULE_LINES = 500


def test_no_module_of_the_kit_over_500_lines():
    """Issue 54: a module holds one job; past 500 lines it holds several (fit.py went from 969 to under 500 in the
    house's third step). The kit's modules: the top level, rn50kit/ and tools/ (the tests aside)."""
    kit = [p for p in python_files() if not os.path.relpath(p, ROOT).startswith("tests" + os.sep)]
    long = {os.path.relpath(p, ROOT): n for p in kit for n in [sum(1 for _ in open(p))] if n > MAX_MODULE_LINES}
    assert len(kit) > 100 and not long, f"split these by job: {long}"


# --- no cycle between the package's folders: each folder is a layer, importing only the ones below it ------------
def folder_imports(package_dir):
    """{folder: {folders it imports}} of a package's folders (package_dir/<folder>/...py), from every import
    statement, inside functions too (a lazy import is a dependency all the same)."""
    package = os.path.basename(package_dir)
    imports = {}
    for folder in sorted(os.listdir(package_dir)):
        for dirpath, _, files in os.walk(os.path.join(package_dir, folder)):
            for name in (f for f in files if f.endswith(".py")):
                path = os.path.join(dirpath, name)
                for node in syntax_nodes(open(path).read(), path):
                    modules = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                        [node.module] if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module else []
                    imports.setdefault(folder, set()).update(
                        parts[1] for parts in (m.split(".") for m in modules)
                        if len(parts) > 1 and parts[0] == package and parts[1] != folder
                        and os.path.isdir(os.path.join(package_dir, parts[1])))
    return imports


def folder_cycle(imports):
    """A list of folders that import each other in a ring (the first repeated last), or None."""
    def visit(folder, path):
        for other in sorted(imports.get(folder, ())):
            if other in path:
                return path[path.index(other):] + [other]
            found = visit(other, path + [other])
            if found:
                return found
        return None
    return next((cycle for folder in sorted(imports) for cycle in [visit(folder, [folder])] if cycle), None)


def test_no_cycle_between_the_packages_folders():
    """Issue 54: rn50kit's folders are layers (common, config, hardware, data, weights, scoring, training, launch,
    benchmarking, ...): a folder that imports another never is imported by it, directly or around a ring."""
    imports = folder_imports(os.path.join(ROOT, "rn50kit"))
    assert {"config", "training", "launch", "weights"} <= set(imports)
    assert folder_cycle(imports) is None, f"these folders import each other: {' -> '.join(folder_cycle(imports))}"


def test_the_cycle_rule_sees_a_ring_and_a_lazy_import(tmp_path):
    for folder, source in {"low": "import os\n", "mid": "from pkg.low import a\n",
                           "top": "def f():\n    from pkg.mid import b\n"}.items():
        (tmp_path / "pkg" / folder).mkdir(parents=True)
        (tmp_path / "pkg" / folder / "m.py").write_text(source)
    assert folder_cycle(folder_imports(str(tmp_path / "pkg"))) is None
    (tmp_path / "pkg" / "low" / "m.py").write_text("def g():\n    import pkg.top.m\n")
    assert folder_cycle(folder_imports(str(tmp_path / "pkg"))) == ["low", "top", "mid", "low"]


# --- no Horovod broadcast: in 0.28.1 it can read a freed name and crash the worker (Distributed.broadcast_) ---------
HOROVOD_BROADCASTS = {"broadcast", "broadcast_", "broadcast_parameters", "broadcast_object",
                      "broadcast_optimizer_state", "broadcast_variables", "broadcast_global_variables",
                      "alltoall"}  # EnqueueTensorAlltoall logs its name after queueing too


def horovod_broadcasts(source, name="<source>"):
    """Where ``source`` calls one of Horovod's broadcasts (on an object whose name says Horovod: hvd, self.hvd) or
    imports one from a Horovod module."""
    found = []
    for node in syntax_nodes(source, name):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("horovod") and \
                any(alias.name in HOROVOD_BROADCASTS for alias in node.names):
            found.append(f"{name}:{node.lineno} from {node.module} import ...")
        func = node.func if isinstance(node, ast.Call) else None
        if isinstance(func, ast.Attribute) and func.attr in HOROVOD_BROADCASTS and \
                any(word in ast.unparse(func.value) for word in ("hvd", "horovod")):
            found.append(f"{name}:{node.lineno} {ast.unparse(func)}")
    return found


def test_nothing_calls_horovods_broadcast():
    found = [line for path in python_files()
             for line in horovod_broadcasts(open(path).read(), os.path.relpath(path, ROOT))]
    assert not found, "use Distributed.broadcast_ / broadcast_parameters instead of: " + "; ".join(found)


@pytest.mark.parametrize("source", [
    "hvd.broadcast_parameters(params, root_rank=0)", "self.hvd.broadcast(x, 0, name='n')",
    "horovod.mxnet.broadcast_(x, 0)", "hvd.broadcast_object(obj)", "from horovod.mxnet import broadcast_",
    "from horovod.mxnet.mpi_ops import alltoall as a2a"])
def test_the_broadcast_rule_sees_each_way(source):
    assert horovod_broadcasts(source)


@pytest.mark.parametrize("source", ["dist.broadcast_(arrays, 'n')", "dist.broadcast_parameters(net)",
                                    "mx.nd.broadcast_to(x, shape)", "hvd.allreduce_(x, op=hvd.Sum)",
                                    "from horovod.mxnet import allreduce_"])
def test_the_broadcast_rule_lets_the_kits_own_pass(source):
    assert not horovod_broadcasts(source)
