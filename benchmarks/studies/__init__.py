"""Learning studies on the built-in scenes: does pretraining (DINO, iBOT, supervised) beat random
init, and do the scenes rank models."""
