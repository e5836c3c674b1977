"""One check of the CUDA path (``python -m benchmarks.gpu_check``; see ``check.py``):
FlexAttention's options, the GAug paths equal, LocAtViT-S against ViT-S, the commands end to end."""
