"""Training: the model, the data-parallel strategies, precision, the worker torchrun starts and
its launcher. The only part of scalelab that imports torch at module level."""
