import numpy as np
import pytest
from PIL import Image

from locatdino.data import (ADE20KSegmentation, ScenesSegmentation, ShardSegmentation, VOCSegmentation,
                            build_segmentation_dataset, build_source, write_shards)

VOC_IDS = {"train": ["2007_000032", "2007_000039"], "val": ["2008_000002"], "trainaug": ["2007_000032", "2011_003276"]}


def _mask(seed, values):
    rng = np.random.default_rng(seed)
    return rng.choice(values, size=(6, 8)).astype(np.uint8)


def _voc_tree(root):
    voc = root / "VOCdevkit" / "VOC2012"
    for d in ("JPEGImages", "SegmentationClass", "SegmentationClassAug", "ImageSets/Segmentation"):
        (voc / d).mkdir(parents=True)
    palette = [v for i in range(256) for v in ((i * 37) % 256, (i * 91) % 256, (i * 53) % 256)]
    masks = {}
    for k, image_id in enumerate(sorted({i for ids in VOC_IDS.values() for i in ids})):
        Image.new("RGB", (8, 6), (k * 50, 0, 0)).save(voc / "JPEGImages" / f"{image_id}.jpg")
        masks[image_id] = _mask(k, [0, 3, 15, 255])
        pal = Image.fromarray(masks[image_id], "P")
        pal.putpalette(palette)  # SegmentationClass: palette PNG, indices are the labels
        pal.save(voc / "SegmentationClass" / f"{image_id}.png")
        Image.fromarray(masks[image_id], "L").save(voc / "SegmentationClassAug" / f"{image_id}.png")
    for split, ids in VOC_IDS.items():
        (voc / "ImageSets" / "Segmentation" / f"{split}.txt").write_text("\n".join(ids) + "\n")
    return masks


def _ade_tree(root):
    ade = root / "ADEChallengeData2016"
    masks = {}
    for split, prefix, n in (("training", "ADE_train", 3), ("validation", "ADE_val", 2)):
        (ade / "images" / split).mkdir(parents=True)
        (ade / "annotations" / split).mkdir(parents=True)
        for i in range(n):
            name = f"{prefix}_{i + 1:08d}"
            Image.new("RGB", (8, 6), (0, i * 60, 0)).save(ade / "images" / split / f"{name}.jpg")
            masks[name] = _mask(i, [0, 1, 77, 150])
            Image.fromarray(masks[name], "L").save(ade / "annotations" / split / f"{name}.png")
    return masks


@pytest.mark.parametrize("split", ["train", "val", "trainaug"])
def test_voc_reader_splits_and_palette_indices(tmp_path, split):
    masks = _voc_tree(tmp_path)
    for root in (tmp_path, tmp_path / "VOCdevkit", tmp_path / "VOCdevkit" / "VOC2012"):
        ds = VOCSegmentation(root, split)
        assert len(ds) == len(VOC_IDS[split])
    image, mask = ds[len(ds) - 1]
    assert image.mode == "RGB" and image.size == (8, 6)
    np.testing.assert_array_equal(mask, masks[VOC_IDS[split][-1]])
    assert ds.num_classes == 21 and ds.ignore_index == 255 and ds.class_names[15] == "person"
    assert ds.pairs[0][1].parent.name == ("SegmentationClassAug" if split == "trainaug" else "SegmentationClass")


def test_voc_reader_errors_name_the_file(tmp_path):
    _voc_tree(tmp_path)
    (tmp_path / "VOCdevkit/VOC2012/JPEGImages/2008_000002.jpg").unlink()
    with pytest.raises(FileNotFoundError, match="2008_000002.jpg"):
        VOCSegmentation(tmp_path, "val")
    with pytest.raises(FileNotFoundError, match="test.txt"):
        VOCSegmentation(tmp_path, "test")


def test_ade20k_reader(tmp_path):
    masks = _ade_tree(tmp_path)
    ds = ADE20KSegmentation(tmp_path, "validation")
    assert len(ds) == 2 and len(ADE20KSegmentation(tmp_path / "ADEChallengeData2016", "train")) == 3
    image, mask = ds[1]
    np.testing.assert_array_equal(mask, masks["ADE_val_00000002"])
    assert image.mode == "RGB" and ds.num_classes == 151 and ds.ignore_index == 0
    assert ds.class_names[0] == "other" and ds.class_names[150] == "flag"
    with pytest.raises(ValueError, match="split"):
        ADE20KSegmentation(tmp_path, "test")


@pytest.mark.parametrize("kind, split", [("voc", "trainaug"), ("ade20k", "training")])
def test_labelled_shards_read_back_like_the_tree(tmp_path, kind, split):
    (_voc_tree if kind == "voc" else _ade_tree)(tmp_path / "src")
    source = build_source(tmp_path / "src", split=split)
    assert source.kind == kind
    write_shards(source, tmp_path / "shards" / split, maxcount=2, workers=0, progress=False)
    tree = build_segmentation_dataset(kind, tmp_path / "src", split)
    shards = build_segmentation_dataset("shards", tmp_path / "shards", split)
    assert isinstance(shards, ShardSegmentation) and len(shards) == len(tree)
    assert (shards.num_classes, shards.ignore_index, shards.class_names) == (
        tree.num_classes, tree.ignore_index, tree.class_names)
    for i in range(len(tree)):
        np.testing.assert_array_equal(shards[i][1], tree[i][1])
        np.testing.assert_array_equal(np.asarray(shards[i][0]), np.asarray(tree[i][0]))


def test_factory_names(tmp_path):
    ds = build_segmentation_dataset("scenes", None, "val", num_images=3, size=32)
    assert isinstance(ds, ScenesSegmentation) and len(ds) == 3 and ds.split == "val"
    with pytest.raises(ValueError, match="unknown segmentation dataset"):
        build_segmentation_dataset("coco", tmp_path, "val")
    with pytest.raises(ValueError, match="data directory"):
        build_segmentation_dataset("voc", None, "val")


def test_a_shard_that_cannot_be_opened_is_named(tmp_path):
    (tmp_path / "shard-000000.tar").write_text("not a tar")
    with pytest.raises(ValueError, match=f"^{tmp_path / 'shard-000000.tar'}: cannot read the shard"):
        ShardSegmentation(str(tmp_path), num_classes=3)
