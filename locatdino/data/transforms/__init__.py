"""What turns a stored image into a training input: decoding, the DINO multi-crop (in the loader's
workers, or batched on the device), its photometric operations, the classification transform."""
