"""LocAtViT backbone: GAug attention, PRR pooling, timm registry entries, checkpoint loading."""
