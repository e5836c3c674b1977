"""Data: WebDataset shards, multi-crop transform, segmentation readers, built-in scenes."""

from locatdino.data.multicrop import MultiCropTransform, collate_multicrop
from locatdino.data.scenes import SCENE_CLASSES, ScenesSegmentation

__all__ = ["SCENE_CLASSES", "MultiCropTransform", "ScenesSegmentation", "collate_multicrop"]
