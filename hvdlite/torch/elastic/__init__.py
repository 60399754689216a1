"""hvdlite.torch.elastic: Horovod's horovod.torch.elastic: TorchState, ElasticSampler and run,
used as in Horovod::

    state = hvd.elastic.TorchState(model, optimizer, sampler=sampler, epoch=0, batch=0)

    @hvd.elastic.run
    def train(state):
        for state.epoch in range(state.epoch, epochs):
            for state.batch, (x, y) in enumerate(loader):   # loader over state.sampler
                ...; optimizer.step()
                state.sampler.record_batch(state.batch, batch_size)
                if state.batch % commit_every == 0:
                    state.commit()
            state.sampler.set_epoch(state.epoch + 1)
            state.batch = 0
            state.commit()

    train(state)
"""

from hvdlite.common.exceptions import HorovodInternalError, HostsUpdatedInterrupt
from hvdlite.elastic.state import ObjectState, State, run
from hvdlite.torch.elastic.sampler import ElasticSampler
from hvdlite.torch.elastic.state import TorchState

__all__ = [
    "ElasticSampler",
    "HorovodInternalError",
    "HostsUpdatedInterrupt",
    "ObjectState",
    "State",
    "TorchState",
    "run",
]
