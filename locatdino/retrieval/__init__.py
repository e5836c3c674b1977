"""Hummingbird in-context segmentation: memory bank, FAISS index, label transfer, mIoU."""
