"""predict: class names from beside the records, from ImageNet's WordNet ids, and saved with a checkpoint."""
import json

from rn50kit.common import imagenet_classes
from rn50kit.scoring import predict


def test_names_from_beside_the_records(tmp_path):
    rec = tmp_path / "train.rec"
    rec.write_bytes(b"")
    (tmp_path / "train.lst").write_text("0\t1.000000\tdog/a.jpg\n1\t0.000000\tcat/b.jpg\n")
    assert predict.dataset_class_names(str(rec)) == ["cat", "dog"]
    (tmp_path / "classes.txt").write_text("kitten\npuppy\n")  # tools/prepare_folder.py's file comes first
    assert predict.dataset_class_names(str(rec)) == ["kitten", "puppy"]
    assert predict.dataset_class_names(None, str(tmp_path / "val.rec")) == ["kitten", "puppy"]
    assert predict.dataset_class_names(str(tmp_path / "elsewhere" / "train.rec")) is None
    assert predict.training_class_names(None, str(rec), None, 2) == ["kitten", "puppy"]
    assert predict.training_class_names(None, str(rec), None, 3) is None  # another number of classes: not these


def test_imagenet_word_net_ids_become_names():
    assert predict.readable(list(imagenet_classes.SYNSETS)) == imagenet_classes.names()
    assert predict.readable(["n01443537", "n01440764"]) == ["goldfish", "tench"]  # a subset of ImageNet's folders
    assert predict.readable(["n01443537", "mine"]) == ["n01443537", "mine"]  # not all ids: kept as they are


def test_names_saved_with_a_checkpoint_come_first(tmp_path):
    (tmp_path / "m-0002.params").write_bytes(b"")
    (tmp_path / "m-0002.states").write_bytes(b"")
    state = {"epoch": 2, "step": 0, "files": {"params": "m-0002.params", "states": "m-0002.states"},
             "class_names": ["n01443537", "n01440764"]}
    (tmp_path / "m-0002.state.json").write_text(json.dumps(state))
    params = str(tmp_path / "m-0002.params")
    assert predict.checkpoint_class_names(params) == ["n01443537", "n01440764"]
    assert predict.class_names(None, None, params) == ["goldfish", "tench"]
    assert predict.class_names(None, None, str(tmp_path / "m-best.params")) == ["goldfish", "tench"]  # the run's
    other = tmp_path / "names.txt"
    other.write_text("a\nb\n")
    assert predict.class_names(str(other), None, params) == ["a", "b"]  # --class-names wins
    assert predict.class_names(None, None, params, num_classes=5) is None  # names of another head: not used
