import numpy as np
import pytest
from PIL import Image

from locatdino.data import (
    ADE20KSegmentation,
    ScenesSegmentation,
    ShardSegmentation,
    VOCSegmentation,
    build_segmentation_dataset,
    build_source,
    write_shards,
)

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
        tree.num_classes,
        tree.ignore_index,
        tree.class_names,
    )
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


def _pascal_context_tree(root):
    """MMSegmentation's Pascal Context layout: VOCdevkit/VOC2010 with SegmentationClassContext."""
    voc = root / "VOCdevkit" / "VOC2010"
    for d in ("JPEGImages", "SegmentationClassContext", "ImageSets/SegmentationContext"):
        (voc / d).mkdir(parents=True)
    masks, ids = {}, {"train": ["2008_000002", "2008_000003"], "val": ["2008_000007"]}
    for k, image_id in enumerate(ids["train"] + ids["val"]):
        Image.new("RGB", (8, 6), (k * 50, 0, 0)).save(voc / "JPEGImages" / f"{image_id}.jpg")
        masks[image_id] = _mask(k, [0, 1, 37, 59])
        Image.fromarray(masks[image_id], "L").save(voc / "SegmentationClassContext" / f"{image_id}.png")
    for split, names in ids.items():
        (voc / "ImageSets" / "SegmentationContext" / f"{split}.txt").write_text("\n".join(names) + "\n")
    return masks


def _coco_stuff_tree(root):
    """MMSegmentation's COCO-Stuff-164k layout: images/<split>, annotations/<split>/*_labelTrainIds.png."""
    coco = root / "coco_stuff164k"
    masks = {}
    for split, n in (("train2017", 3), ("val2017", 2)):
        (coco / "images" / split).mkdir(parents=True)
        (coco / "annotations" / split).mkdir(parents=True)
        for i in range(n):
            name = f"{i + 1:012d}"
            Image.new("RGB", (8, 6), (0, 0, i * 60)).save(coco / "images" / split / f"{name}.jpg")
            masks[name] = _mask(10 + i, [0, 92, 170, 255])
            Image.fromarray(masks[name], "L").save(coco / "annotations" / split / f"{name}_labelTrainIds.png")
    return masks


def test_pascal_context_59_reader_and_its_ignore_rule(tmp_path):
    from locatdino.data import PascalContextSegmentation
    from locatdino.evaluation.metric import ConfusionMatrix

    masks = _pascal_context_tree(tmp_path)
    for root in (tmp_path, tmp_path / "VOCdevkit", tmp_path / "VOCdevkit" / "VOC2010"):
        assert len(PascalContextSegmentation(root, "train")) == 2
    ds = build_segmentation_dataset("pascal_context", tmp_path, "val")
    image, mask = ds[0]
    np.testing.assert_array_equal(mask, masks["2008_000007"])
    assert image.mode == "RGB" and image.size == (8, 6)
    # 59 classes 1..59 scored, background 0 ignored (MMSegmentation's PascalContextDataset59)
    assert ds.num_classes == 60 and ds.ignore_index == 0 and len(ds.class_names) == 60
    assert ds.class_names[0] == "background" and ds.class_names[1] == "aeroplane" and ds.class_names[59] == "wood"
    cm = ConfusionMatrix(ds.num_classes, ds.ignore_index)
    cm.update(np.full_like(mask, 37), mask)  # predict class 37 everywhere
    assert cm.matrix.sum() == np.count_nonzero(mask)  # background pixels not counted
    iou = cm.compute().iou
    assert np.isnan(iou[0]) and set(np.flatnonzero(~np.isnan(iou))) == set(np.unique(mask[mask > 0]))
    with pytest.raises(FileNotFoundError, match="test.txt"):
        PascalContextSegmentation(tmp_path, "test")
    (tmp_path / "VOCdevkit/VOC2010/SegmentationClassContext/2008_000003.png").unlink()
    with pytest.raises(FileNotFoundError, match="2008_000003.png"):
        PascalContextSegmentation(tmp_path, "train")


def test_coco_stuff_164k_reader_and_its_ignore_rule(tmp_path):
    from locatdino.data import COCOStuffSegmentation
    from locatdino.evaluation.metric import ConfusionMatrix

    masks = _coco_stuff_tree(tmp_path)
    ds = build_segmentation_dataset("coco_stuff", tmp_path, "val")
    assert len(ds) == 2 and len(COCOStuffSegmentation(tmp_path / "coco_stuff164k", "train2017")) == 3
    image, mask = ds[1]
    np.testing.assert_array_equal(mask, masks["000000000002"])
    assert image.mode == "RGB" and ds.num_classes == 171 and ds.ignore_index == 255
    assert ds.class_names[0] == "person" and ds.class_names[80] == "banner" and ds.class_names[170] == "wood"
    cm = ConfusionMatrix(ds.num_classes, ds.ignore_index)
    cm.update(np.zeros_like(mask), mask)  # class 0 (person) is a class here, 255 is not
    assert cm.matrix.sum() == np.count_nonzero(mask != 255) and cm.matrix[0, 0] == np.count_nonzero(mask == 0)
    with pytest.raises(ValueError, match="split"):
        COCOStuffSegmentation(tmp_path, "test2017")
    (tmp_path / "coco_stuff164k/annotations/train2017/000000000001_labelTrainIds.png").unlink()
    with pytest.raises(FileNotFoundError, match="_labelTrainIds"):
        COCOStuffSegmentation(tmp_path, "train")
