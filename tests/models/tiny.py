"""Tiny ViT geometry shared by the models tests: 2 blocks, 64 wide, 64 px (fast on 2 CPU cores)."""

TINY = dict(img_size=64, depth=2, embed_dim=64, num_heads=2)

# A Swin small enough for the tests yet with every Swin path: at 56 px (grid 14, windows of 4) the
# first two stages pad their maps to whole windows and shift every second block, the last stage's
# map (2 × 2) is smaller than a window; 16 wide, heads 1-2-2-4 (head size 16 throughout)
TINY_SWIN = dict(img_size=56, embed_dim=16, depths=(2, 2, 2, 2), num_heads=(1, 2, 4, 8), window_size=4)
