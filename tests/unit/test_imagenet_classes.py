"""imagenet_classes: the ImageNet-1k names in im2rec's label order (sorted WordNet ids), from a data file that an
installed kit has too."""
import fnmatch
import json
import os
import subprocess
import sys

from rn50kit.common import imagenet_classes
from support.processes import HANG_S, ROOT, venv_env


def test_thousand_classes_in_sorted_synset_order():
    synsets = imagenet_classes.SYNSETS
    assert len(synsets) == len(set(synsets)) == 1000
    assert list(synsets) == sorted(synsets)  # im2rec numbers the sorted class folders
    names = imagenet_classes.names()
    assert len(set(names)) == 1000
    # well-known labels of ImageNet-trained models
    assert (names[0], names[1], names[281], names[285], names[999]) == \
        ("tench", "goldfish", "tabby", "Egyptian cat", "toilet tissue")
    assert (synsets[0], synsets[281], synsets[999]) == ("n01440764", "n02123045", "n15075141")
    assert imagenet_classes.names(with_ids=True)[281] == "n02123045 tabby"


def test_names_for_imagenet_folders_only():
    assert imagenet_classes.names_for(imagenet_classes.SYNSETS)[281] == "tabby"
    assert imagenet_classes.names_for(["cat", "dog"]) is None


def test_the_names_are_read_on_first_use_not_at_import():
    """Importing the module does not read the names (the kit's modules only define at import); they come from the
    package's data file when first asked for, once."""
    code = ("from rn50kit.common import imagenet_classes as m\n"
            "print(m.classes.cache_info().currsize)\n"
            "print(len(m.CLASSES), m.classes.cache_info().currsize)")
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=venv_env(), capture_output=True, text=True,
                            timeout=HANG_S)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.split() == ["0", "1000", "1"]


def test_every_data_file_of_the_package_is_installed():
    """setup.py's package_data covers every file of rn50kit that is not Python (the class names, the recipes):
    an installed kit has them, not only a checkout."""
    result = subprocess.run([sys.executable, "-c", "import json, runpy, setuptools\ncaptured = {}\n"
                             "setuptools.setup = lambda **kw: captured.update(kw)\nrunpy.run_path('setup.py')\n"
                             "print(json.dumps(captured['package_data']))"],
                            cwd=ROOT, env=venv_env(), capture_output=True, text=True, timeout=HANG_S)
    assert result.returncode == 0, result.stderr[-2000:]
    package_data = json.loads(result.stdout)
    listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "rn50kit"], cwd=ROOT,
                            capture_output=True, text=True, timeout=HANG_S, check=True).stdout.split()
    data_files = [path for path in listed if not path.endswith(".py")]
    assert "rn50kit/common/imagenet_classes.tsv" in data_files

    def installed(path):
        folder, name = os.path.split(path)
        for package, patterns in package_data.items():
            base = package.replace(".", "/")
            if folder == base or folder.startswith(base + "/"):
                inside = os.path.relpath(path, base)
                if any(fnmatch.fnmatch(inside, pattern) for pattern in patterns):
                    return True
        return False
    assert [path for path in data_files if not installed(path)] == []
