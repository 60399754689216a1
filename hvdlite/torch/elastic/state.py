"""TorchState: ObjectState whose models, optimizers and ElasticSamplers are saved, restored and
synced through their state_dicts (Horovod's horovod.torch.elastic.TorchState)."""

import copy
from typing import Any

import torch

from hvdlite.common.exceptions import HostsUpdatedInterrupt, NotSupportedError, ShardsLostError
from hvdlite.common.objects import broadcast_object
from hvdlite.common.topology import rank
from hvdlite.elastic import worker
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


def _is_sharded_optimizer(value):
    """A ZeroOptimizer (or any optimizer with sharded state that makes its own elastic handler)."""
    return isinstance(value, torch.optim.Optimizer) and callable(getattr(value, "elastic_handler", None))


def _handler_for(value):
    if _is_sharded_optimizer(value):
        return value.elastic_handler()
    for kind, handler in _HANDLERS:
        if isinstance(value, kind):
            return handler(value)
    return None


def _generation_workers():
    """The elastic workers of this process's generation (ids), or None outside an elastic job."""
    ctx = worker.context()
    return None if ctx is None else set(ctx.current()["workers"])


def _check_no_new_workers(state):
    """ZeRO shards are rebuilt by the survivors only: a worker that joined in the new generation
    would be constructing its optimizer (collectives the survivors never run). Raised before
    any collective, naming the workers."""
    old, new = state._workers, _generation_workers()
    if old is not None and new is not None and new - old:
        raise NotSupportedError(
            "hvd.elastic.TorchState with a ZeroOptimizer: worker(s) %s joined the job; ZeRO jobs can "
            "lose workers but not gain them (launch with --max-np equal to -np)"
            % ", ".join(sorted(new - old))
        )


class TorchState(ObjectState):
    """State of a PyTorch training process: ``TorchState(model, optimizer, epoch=0, batch=0)``.

    Every keyword becomes an attribute. Modules, optimizers, hvd.DiLoCo and ElasticSamplers are handled
    through their state_dicts (sync: broadcast_parameters / broadcast_optimizer_state from rank
    0); everything else is an ordinary picklable object. Several models or optimizers may be
    passed as keywords. buddy_overlap (ZeroOptimizers only; docs/elastic.md, "ZeRO"): True lets
    commit() return once the buddy copies' exchange started, at the cost of a second buddy
    buffer; False waits for it. Neither matters where the ranks share /dev/shm: there the buddy
    maps the owner's copy and nothing is exchanged (HVDLITE_BUDDY_SHARED_MEMORY)."""

    _handlers: dict[str, Any]
    _history: dict[int, tuple[dict[str, Any], dict[str, Any]]]
    _workers: set[str] | None  # with ZeRO: the elastic workers of the last commit's generation

    def __init__(self, model=None, optimizer=None, buddy_overlap=True, **kwargs):
        kwargs.update(model=model, optimizer=optimizer)
        handlers, plain = {}, {}
        zero_models: dict[int, Any] = {}
        for value in kwargs.values():  # ZeroOptimizers first: their models are kept apart
            if _is_sharded_optimizer(value):
                zero_models[id(getattr(value, "model", None))] = value
        for key, value in kwargs.items():
            if id(value) in zero_models and isinstance(value, torch.nn.Module):
                handler = zero_models[id(value)].elastic_model_handler()
            else:
                handler = _handler_for(value)
            if handler is None:
                plain[key] = value
            else:
                handlers[key] = handler
        object.__setattr__(self, "_handlers", handlers)
        object.__setattr__(self, "_history", {})  # ZeRO commit version -> the local saves
        for handler in self._zero_handlers():  # False: each commit waits for its buddy exchange
            handler.copies.overlap = bool(buddy_overlap)
        for key, handler in handlers.items():
            object.__setattr__(self, key, handler.value)
        super().__init__(bcast_object=broadcast_object, get_rank=rank, **plain)
        zero = self._zero_handlers()
        if zero:
            self._record(zero[0].copies.version)
        object.__setattr__(self, "_workers", _generation_workers() if zero else None)

    def _zero_handlers(self):
        return [h for h in self._handlers.values() if hasattr(h, "rebuild")]

    def _record(self, version):
        """With ZeRO: remembers this commit's local saves under its version (the last two), so
        that a rebuild that falls back to an earlier commit restores the matching ones. Recorded
        before the buddy exchange: a rank whose exchange fails still has them."""
        local = {k: h._saved for k, h in self._handlers.items() if not hasattr(h, "rebuild")}
        self._history[version] = (local, self._saved_state)
        for old in [v for v in self._history if v < version - 1]:
            del self._history[old]

    def save(self):
        """Local copies first (they cannot fail), then the ZeRO handlers' buddy exchanges. The
        last commit's exchanges end first: their failure raises before this commit records."""
        zero = self._zero_handlers()
        for handler in zero:
            handler.copies.settle(raise_errors=True)
        for handler in self._handlers.values():
            if handler not in zero:
                handler.save()
        super().save()
        if zero:
            self._record(zero[0].next_version)
        for handler in zero:
            handler.save()

    def check_host_updates(self):
        """As State's; before the job re-forms for a host update, the buddy exchanges still
        running end (every rank is alive), so the re-formed job rebuilds this commit."""
        try:
            super().check_host_updates()
        except HostsUpdatedInterrupt:
            for handler in self._zero_handlers():
                handler.copies.settle()
            raise

    def restore(self):
        for handler in self._handlers.values():
            handler.restore()
        super().restore()

    def sync(self):
        for handler in self._handlers.values():
            handler.sync()
        super().sync()

    def reset(self):
        zero = self._zero_handlers()
        if zero:
            self._rebuild(zero)  # also when only hosts changed: shards of lost ranks are rebuilt
        for handler in self._handlers.values():
            if isinstance(handler.value, ElasticSampler):
                handler.value.reset()  # re-partition over the new ranks

    def _rebuild(self, zero):
        """After re-form: every ZeroOptimizer rebuilds the newest commit all its shards survived
        in; the other handlers and the plain attributes go back to that same commit; then the new
        world commits (buddy copies placed anew). Collective."""
        _check_no_new_workers(self)
        plans = [h.recover_plan() for h in zero]
        version = min(p.version for p in plans)  # a commit cut short between two optimizers
        if version not in self._history:
            raise ShardsLostError(
                "hvd.elastic.TorchState: commit %d is no longer kept; restart from the last disk "
                "checkpoint (hvd.load_checkpoint)" % version
            )
        for handler, plan in zip(zero, plans):
            handler.rebuild(plan if plan.version == version else plan.at(version))
        local, plain = self._history[version]
        for key, saved in local.items():
            self._handlers[key]._saved = saved
            self._handlers[key].restore()
        self._saved_state = plain
        self._set_attrs()
        self.save()
        object.__setattr__(self, "_workers", _generation_workers())

    def __setattr__(self, name, value):
        handlers = self.__dict__.get("_handlers", {})
        if name in handlers:
            handlers[name].set_value(value)
        object.__setattr__(self, name, value)
