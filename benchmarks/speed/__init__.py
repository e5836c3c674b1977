"""Speed and memory: LocAtViT against ViT, the data path, the DINO step, Hummingbird against the
reference's data flow, MFU."""
