"""A stand-in for the few torchvision names Horovod's PyTorch examples use, for machines without
torchvision and without a network (compat/examples/run_offline.py puts it on PYTHONPATH only when
torchvision itself is not importable). Not torchvision: datasets.MNIST reads torchvision's on-disk
MNIST files and never downloads; models.resnet50 is the standard ResNet-50 architecture, untrained."""

from torchvision import datasets, models, transforms

__version__ = "0.0+hvdlite-standin"
