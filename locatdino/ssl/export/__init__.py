"""``locatdino export``: a run's evaluated backbone as files timm loads without this package —
the command (``cli``), the file formats and their metadata (``files``) and the Hugging Face Hub
model card (``model_card``)."""
