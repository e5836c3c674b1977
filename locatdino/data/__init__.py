"""Data: WebDataset shards, multi-crop transform, segmentation readers, built-in scenes."""
