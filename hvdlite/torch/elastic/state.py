"""TorchState: ObjectState whose models, optimizers and ElasticSamplers are saved, restored and
synced through their state_dicts (Horovod's horovod.torch.elastic.TorchState)."""

import copy

import torch

from hvdlite.common.exceptions import NotSupportedError
from hvdlite.common.objects import broadcast_object
from hvdlite.common.topology import rank
from hvdlite.elastic.state import ObjectState
from hvdlite.torch.diloco import DiLoCo
from hvdlite.torch.elastic.sampler import ElasticSampler
from hvdlite.torch.functions import broadcast_optimizer_state, broadcast_parameters


class _Handler:
    """Saves/restores/syncs one object through its state_dict. save() copies to host memory."""

    def __init__(self, value):
        self.value = value
        self.save()

    def save(self):
        self._saved = copy.deepcopy(self.value.state_dict())

    def restore(self):
        self.value.load_state_dict(self._saved)

    def set_value(self, value):
        self.value = value
        self.save()

    def sync(self):
        """Makes every rank's object rank 0's (a collective)."""
        raise NotSupportedError("%s must define sync()" % type(self).__name__)


class _ModelHandler(_Handler):
    def sync(self):
        broadcast_parameters(self.value.state_dict(), root_rank=0)


class _OptimizerHandler(_Handler):
    def sync(self):
        broadcast_optimizer_state(self.value, root_rank=0)


class _DiLoCoHandler(_Handler):
    def sync(self):
        self.value.broadcast_state(root_rank=0)


class _SamplerHandler(_Handler):
    def sync(self):
        self.value.load_state_dict(broadcast_object(self.value.state_dict()))


_HANDLERS = [
    (torch.nn.Module, _ModelHandler),
    (torch.optim.Optimizer, _OptimizerHandler),
    (ElasticSampler, _SamplerHandler),
    (DiLoCo, _DiLoCoHandler),
]


def _handler_for(value):
    for kind, handler in _HANDLERS:
        if isinstance(value, kind):
            return handler(value)
    return None


class TorchState(ObjectState):
    """State of a PyTorch training process: ``TorchState(model, optimizer, epoch=0, batch=0)``.

    Every keyword becomes an attribute. Modules, optimizers, hvd.DiLoCo and ElasticSamplers are handled
    through their state_dicts (sync: broadcast_parameters / broadcast_optimizer_state from rank
    0); everything else is an ordinary picklable object. Several models or optimizers may be
    passed as keywords."""

    _handlers: dict[str, _Handler]

    def __init__(self, model=None, optimizer=None, **kwargs):
        kwargs.update(model=model, optimizer=optimizer)
        handlers, plain = {}, {}
        for key, value in kwargs.items():
            handler = _handler_for(value)
            if handler is None:
                plain[key] = value
            else:
                handlers[key] = handler
        object.__setattr__(self, "_handlers", handlers)
        for key, handler in handlers.items():
            object.__setattr__(self, key, handler.value)
        super().__init__(bcast_object=broadcast_object, get_rank=rank, **plain)

    def save(self):
        for handler in self._handlers.values():
            handler.save()
        super().save()

    def restore(self):
        for handler in self._handlers.values():
            handler.restore()
        super().restore()

    def sync(self):
        for handler in self._handlers.values():
            handler.sync()
        super().sync()

    def reset(self):
        for handler in self._handlers.values():
            if isinstance(handler.value, ElasticSampler):
                handler.value.reset()  # re-partition over the new ranks

    def __setattr__(self, name, value):
        handlers = self.__dict__.get("_handlers", {})
        if name in handlers:
            handlers[name].set_value(value)
        object.__setattr__(self, name, value)
