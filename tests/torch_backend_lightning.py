"""Rank body of tests/test_torch_backend_lightning.py: a Lightning Trainer whose strategy runs
torch.distributed on the backend CASE_BACKEND names (process_group_backend=...), launched the way
a cluster launches it (Lightning reads the job from torch's variables); returns the trained
weights."""

import os

import torch
import torch.nn as nn

STEPS, PER_RANK = 4, 4


def _data(n):
    g = torch.Generator().manual_seed(1)
    return torch.randn(STEPS * PER_RANK * n, 16, generator=g), torch.randn(
        STEPS * PER_RANK * n, 4, generator=g
    )


def _net():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))


def train(strategy_name):
    import lightning as L
    from lightning.pytorch.strategies import DDPStrategy, FSDPStrategy
    from torch.utils.data import DataLoader, TensorDataset

    import hvdlite.torch  # noqa: F401  (registers the backend)

    torch.set_num_threads(1)
    n = int(os.environ["WORLD_SIZE"])

    class Regression(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = _net()

        def training_step(self, batch, _):
            return nn.functional.mse_loss(self.net(batch[0]), batch[1])

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    strategy_cls = {"ddp": DDPStrategy, "fsdp": FSDPStrategy}[strategy_name]
    strategy = strategy_cls(process_group_backend=os.environ["CASE_BACKEND"])
    x, y = _data(n)
    trainer = L.Trainer(
        accelerator="cpu",
        devices=n,
        strategy=strategy,
        max_steps=STEPS,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    model = Regression()
    loader = DataLoader(TensorDataset(x, y), batch_size=PER_RANK, shuffle=False)
    trainer.fit(model, loader)
    import torch.distributed as dist

    backend = dist.get_backend()
    if strategy_name == "fsdp":
        from torch.distributed.fsdp import FullStateDictConfig, StateDictType
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

        with FSDP.state_dict_type(
            trainer.strategy.model, StateDictType.FULL_STATE_DICT, FullStateDictConfig(rank0_only=False)
        ):
            state = {
                k.replace("_fsdp_wrapped_module.", ""): v
                for k, v in trainer.strategy.model.state_dict().items()
            }
        state = {k[len("net.") :]: v for k, v in state.items() if k.startswith("net.")}
    else:
        state = model.net.state_dict()
    dist.destroy_process_group()
    return backend, {
        k: v.detach().reshape(-1).tolist() for k, v in state.items()
    }  # plain lists: tensors would travel as shared memory the exiting rank takes with it
