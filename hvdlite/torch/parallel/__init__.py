"""hvdlite.torch.parallel (``hvd.parallel``): tensor and pipeline parallelism for PyTorch
modules, built only on hvdlite.torch's public collectives. One file per technique."""
