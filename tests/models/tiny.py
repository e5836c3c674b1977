"""Tiny ViT geometry shared by the models tests: 2 blocks, 64 wide, 64 px (fast on 2 CPU cores)."""

TINY = dict(img_size=64, depth=2, embed_dim=64, num_heads=2)
