#!/usr/bin/env python3
"""What this Python offers the kit, as one table: MXNet's version and build (CUDA, cuDNN, NCCL, oneDNN), NVIDIA's
fused BatchNorm ops, Horovod's frameworks and controllers, DALI and Open MPI. The last step of
`make setup-container` (tools/setup_container.sh); it runs anywhere the kit does:

    python tools/check_environment.py            # the table; exit 1 with one line when the kit cannot run here
    python tools/check_environment.py --json     # the same as JSON
    python tools/check_environment.py --keep     # pip constraints (NAME==VERSION) of MXNet, numpy and Horovod
"""
import argparse
import importlib.metadata
import json
import os
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from rn50kit.common import supported  # noqa: E402  (loads on the Pythons it refuses)

KEPT = ("numpy", "horovod")  # with MXNet's distribution: what a container brings and the set-up never replaces


def distribution_version(name):
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def mxnet_distribution():
    """(name, version) of the installed MXNet distribution (mxnet, mxnet-cu112, NVIDIA's ...), or None."""
    for dist in importlib.metadata.distributions():
        name = (dist.metadata["Name"] or "").lower()
        if name == "mxnet" or name.startswith("mxnet-"):
            return name, dist.version
    return None


def kept_constraints():
    """NAME==VERSION lines pinning what the container brought, for every pip install of the set-up."""
    lines = [f"{name}=={distribution_version(name)}" for name in KEPT if distribution_version(name)]
    found = mxnet_distribution()
    if found:
        lines.insert(0, f"{found[0]}=={found[1]}")
    return lines


def mxnet_facts():
    """MXNet's version, build features and NVIDIA's fused ops; {"error": ...} where it does not import."""
    try:
        import mxnet as mx
    except Exception as error:  # noqa: BLE001  (any failure to load is the fact to report)
        return {"error": f"MXNet does not import: {error}"}
    from rn50kit.hardware import devices
    features = mx.runtime.Features()
    return {
        "version": mx.__version__,
        "path": os.path.dirname(mx.__file__),
        "features": {name: features.is_enabled(name) for name in ("CUDA", "CUDNN", "NCCL", "MKLDNN")},
        "bn_relu": devices.nvidia_bn_relu(),
        "bn_add_relu": devices.nvidia_bn_add_relu(),
        "problem": supported.mxnet_problem(mx.__version__),
    }


def horovod_facts():
    from rn50kit.launch.horovod_build import horovod_build
    version = distribution_version("horovod")
    build = horovod_build() if version else None
    facts = {"version": version, "build": build, "problem": supported.horovod_problem(build)}
    if version:  # other frameworks' bindings are reported, not needed
        import importlib.util
        spec = importlib.util.find_spec("horovod")
        folder = spec.submodule_search_locations[0]
        facts["frameworks"] = ["MXNet"] if build else []
        facts["frameworks"] += [name for name, sub in (("TensorFlow", "tensorflow"), ("PyTorch", "torch"))
                                if any(f.startswith("mpi_lib") for f in os.listdir(os.path.join(folder, sub))
                                       if os.path.isdir(os.path.join(folder, sub)))]
    return facts


def open_mpi_version():
    if shutil.which("mpirun") is None:
        return None
    out = subprocess.run(["mpirun", "--version"], capture_output=True, text=True).stdout
    return out.splitlines()[0].strip() if out else "present"


def gather():
    return {
        "python": sys.version.split()[0],
        "python_problem": supported.python_problem(sys.version_info),
        "mxnet_distribution": mxnet_distribution(),
        "mxnet": mxnet_facts(),
        "horovod": horovod_facts(),
        "dali": distribution_version("nvidia-dali-cuda120") or distribution_version("nvidia-dali-cuda110"),
        "numpy": distribution_version("numpy"),
        "open_mpi": open_mpi_version(),
    }


def yes_no(flag):
    return "yes" if flag else "no"


def table_rows(facts):
    mx, hvd = facts["mxnet"], facts["horovod"]
    rows = [("Python", facts["python"]), ("numpy", facts["numpy"] or "not installed")]
    if "error" in mx:
        rows.append(("MXNet", mx["error"]))
    else:
        dist = facts["mxnet_distribution"]
        rows.append(("MXNet", f"{mx['version']} ({dist[0] if dist else 'no distribution record'}, {mx['path']})"))
        rows.append(("  build", ", ".join(f"{name} {yes_no(on)}" for name, on in mx["features"].items())))
        nvidia = mx["bn_relu"] and mx["bn_add_relu"]
        rows.append(("  NVIDIA fused ops", f"BatchNorm+ReLU {yes_no(mx['bn_relu'])}, BatchNormAddRelu "
                     f"{yes_no(mx['bn_add_relu'])}" + (" (float16 GPU runs fuse them)" if nvidia else "")))
    if hvd["version"] is None:
        rows.append(("Horovod", "not installed"))
    else:
        build = hvd["build"] or {}
        controllers = ", ".join(name for name in ("gloo", "mpi") if build.get(name)) or "none"
        rows.append(("Horovod", f"{hvd['version']}: frameworks {', '.join(hvd['frameworks']) or 'none'}; "
                     f"controllers {controllers}; NCCL {yes_no(build.get('nccl'))}"))
    rows.append(("DALI", facts["dali"] or "not installed"))
    rows.append(("Open MPI", facts["open_mpi"] or "not installed (runner --launcher mpi/slurm need it)"))
    return rows


def problems(facts):
    found = [facts["python_problem"], facts["mxnet"].get("error"), facts["mxnet"].get("problem"),
             facts["horovod"]["problem"]]
    if facts["dali"] is None:
        found.append("DALI is not installed: run `make setup-container` (or `make setup`)")
    return [problem for problem in found if problem]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", action="store_true", help="print the facts as JSON")
    parser.add_argument("--keep", action="store_true", help="print pip constraints of MXNet, numpy and Horovod")
    args = parser.parse_args(argv)
    supported.require_supported_python("check_environment")
    if args.keep:
        print("\n".join(kept_constraints()))
        return 0
    facts = gather()
    if args.json:
        print(json.dumps(facts, indent=2))
    else:
        rows = table_rows(facts)
        width = max(len(name) for name, _ in rows)
        for name, value in rows:
            print(f"{name:<{width}}  {value}")
    for problem in problems(facts):
        print(f"check_environment: error: {problem}", file=sys.stderr)
    return 1 if problems(facts) else 0


if __name__ == "__main__":
    sys.exit(main())
