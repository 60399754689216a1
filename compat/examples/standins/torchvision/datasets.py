"""datasets.MNIST: reads the IDX files torchvision keeps under ROOT/MNIST/raw/ and never downloads."""

import os

import numpy as np
import torch.utils.data

_FILES = {
    True: ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    False: ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}


def _read_idx(path):
    with open(path, "rb") as f:
        data = f.read()
    ndim = data[3]
    shape = tuple(int.from_bytes(data[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim))
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim).reshape(shape).copy()


class MNIST(torch.utils.data.Dataset):
    def __init__(self, root, train=True, transform=None, target_transform=None, download=False):
        raw = os.path.join(os.path.expanduser(root), "MNIST", "raw")
        images, labels = (os.path.join(raw, name) for name in _FILES[bool(train)])
        if not (os.path.exists(images) and os.path.exists(labels)):
            raise RuntimeError("stand-in torchvision: no MNIST files in %s, and it never downloads" % raw)
        self.data, self.targets = _read_idx(images), _read_idx(labels).astype(np.int64)
        self.transform, self.target_transform = transform, target_transform

    def __len__(self):
        return len(self.targets)

    def __getitem__(self, index):
        img, target = self.data[index], int(self.targets[index])
        if self.transform is not None:
            img = self.transform(img)
        if self.target_transform is not None:
            target = self.target_transform(target)
        return img, target
