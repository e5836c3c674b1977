"""Segmentation dataset readers: Pascal VOC, ADE20K, Pascal Context, COCO-Stuff (image / mask file
pairs), and ``build_segmentation_dataset``, which opens any of them (or shards, or scenes) by name."""
