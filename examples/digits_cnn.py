"""The small CNN of examples/pytorch_digits.py (torch only, so benchmarks can build it in any
environment, Horovod's included)."""

import torch
import torch.nn.functional as F


class SmallCNN(torch.nn.Module):
    """8x8 grey images -> 10 classes: two 3x3 convolutions, one pooling, two dense layers."""

    def __init__(self):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(1, 16, 3, padding=1)
        self.conv2 = torch.nn.Conv2d(16, 32, 3, padding=1)
        self.fc1 = torch.nn.Linear(32 * 4 * 4, 64)
        self.fc2 = torch.nn.Linear(64, 10)

    def forward(self, x):
        x = F.relu(self.conv1(x))
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc2(F.relu(self.fc1(x.flatten(1))))
