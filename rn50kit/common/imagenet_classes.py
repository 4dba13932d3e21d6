"""The ImageNet-1k (ILSVRC2012) classes in the order im2rec numbers them: WordNet ids sorted, labels 0..999.

A network trained on ImageNet prepared by tools/prepare_imagenet.sh (class folders named by WordNet id) predicts
label i for classes()[i]. The list is GluonCV's (PyPI package gluoncv 0.10.5.post0, Apache-2.0, file
gluoncv/data/imagenet/classification.py, ``_ILSVRC2012_Attr``: WordNet id and short name), taken unchanged; it is
package data, imagenet_classes.tsv beside this module (a WordNet id and a name per line), read on first use.

    python -m rn50kit.common.imagenet_classes [--ids] > classes.txt      one name per line, for --class-names
"""
import argparse
import functools
from importlib import resources

DATA_FILE = "imagenet_classes.tsv"


@functools.cache
def classes():
    """The 1000 (WordNet id, short name) pairs in label order."""
    text = resources.files(__package__).joinpath(DATA_FILE).read_text(encoding="utf-8")
    return tuple(tuple(line.split("\t", 1)) for line in text.splitlines() if line and not line.startswith("#"))


def synsets():
    """The 1000 WordNet ids in label order."""
    return tuple(synset for synset, _ in classes())


def __getattr__(name):
    """CLASSES and SYNSETS, the tuples this module held before the list became a data file, read when asked for."""
    if name == "CLASSES":
        return classes()
    if name == "SYNSETS":
        return synsets()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def names(with_ids=False):
    """The 1000 class names in label order. Two short names occur twice ("crane": the bird and the machine;
    "maillot"): those get their WordNet id in brackets, so every name is unique. ``with_ids``: "n01440764 tench"."""
    counts = {}
    for _, name in classes():
        counts[name] = counts.get(name, 0) + 1
    return [f"{synset} {name}" if with_ids else (f"{name} ({synset})" if counts[name] > 1 else name)
            for synset, name in classes()]


def names_for(folder_names):
    """Readable names for a dataset whose class folders are the ImageNet-1k WordNet ids (in label order, as
    classes.txt or a .lst gives them); None for any other dataset."""
    return names() if list(folder_names) == list(synsets()) else None


def main(argv=None):
    parser = argparse.ArgumentParser(description="Print the ImageNet-1k class names, one per line, in label order")
    parser.add_argument("--ids", action="store_true", help="prefix each name with its WordNet id")
    args = parser.parse_args(argv)
    print("\n".join(names(args.ids)))


if __name__ == "__main__":
    main()
