"""ElasticSampler: Horovod's sampler that re-partitions the rest of an epoch after a reset."""

import math
import random

import torch.utils.data

from hvdlite.common.topology import rank, size


class ElasticSampler(torch.utils.data.Sampler[int]):
    """Partitions `dataset` across the ranks; after a reset (tracked by a TorchState) the samples
    not yet processed this epoch are partitioned among the new set of ranks.

    Use: put it in the TorchState, call record_batch(batch_idx, batch_size) after each batch and
    set_epoch(epoch) at the end (not the start) of each epoch. shuffle/seed must be the same on
    every rank."""

    def __init__(self, dataset, shuffle=True, seed=0):
        self.dataset = dataset
        self.shuffle = shuffle
        self.seed = seed
        self.epoch = 0
        self.processed_num = 0
        self.num_replicas = 0
        self.rank = 0
        self.remaining_indices = []
        self.num_samples = 0
        self.total_size = 0
        self.indices = []
        self.reset()

    def set_epoch(self, epoch):
        """Starts `epoch`: a new shuffle, nothing processed yet."""
        self.epoch = epoch
        self.processed_num = 0
        self.reset()

    def record_batch(self, batch_idx, batch_size):
        """Records one batch of `batch_size` samples per rank as processed."""
        self.processed_num += batch_size * self.num_replicas

    def record_indices(self, indices):
        """Records `indices` (of this rank's batch) as processed (counts them on every rank)."""
        self.processed_num += len(indices) * self.num_replicas

    def state_dict(self):
        return {"epoch": self.epoch, "processed_num": self.processed_num}

    def load_state_dict(self, state_dict):
        self.epoch = state_dict["epoch"]
        self.processed_num = state_dict["processed_num"]
        self.reset()

    def reset(self):
        """Re-partitions the unprocessed samples of this epoch over the current ranks."""
        self.num_replicas = size()
        self.rank = rank()
        indices = list(range(len(self.dataset)))
        if self.shuffle:
            random.Random(self.seed + self.epoch).shuffle(indices)
        self.remaining_indices = indices[self.processed_num :]
        self.num_samples = math.ceil(len(self.remaining_indices) / self.num_replicas)
        self.total_size = self.num_samples * self.num_replicas

    def __iter__(self):
        indices = self.remaining_indices[:]
        indices += indices[: self.total_size - len(indices)]  # pad to a multiple of the ranks
        self.indices = indices[self.rank : self.total_size : self.num_replicas]
        return iter(self.indices)

    def __len__(self):
        return self.num_samples
