"""Compute emulated by sleeping, for the pipeline benchmarks: the ranks do not compete for the
cores, so a measurement shows the schedule and the stage-to-stage transfers, not the load."""

import time

import torch


class Sleep(torch.autograd.Function):
    """Identity that sleeps fwd_ms forward and bwd_ms backward (the caller's thread blocks)."""

    @staticmethod
    def forward(ctx, x, fwd_ms, bwd_ms):
        ctx.bwd_ms = bwd_ms
        time.sleep(fwd_ms / 1000)
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        time.sleep(ctx.bwd_ms / 1000)
        return grad, None, None
