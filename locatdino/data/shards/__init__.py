"""WebDataset shards: the writer and its sources (``locatdino shards``), the streaming loader,
image labels and segmentation read back from shards, and the count of skipped samples."""
