"""imagenet_classes: the ImageNet-1k names in im2rec's label order (sorted WordNet ids)."""
from rn50kit.common import imagenet_classes


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
