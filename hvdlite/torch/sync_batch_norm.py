"""SyncBatchNorm: batch normalization whose statistics are those of the
global batch (every rank's samples together), forward and backward.

Forward: each rank sums x and x*x per channel (in float64) and its sample
count; one allreduce(Sum) gives the global mean and biased variance, which
normalize the local samples and update the running statistics (unbiased
variance, as BatchNorm does). Backward: the per-channel sums of dy and
dy * x_hat are allreduced so the input gradient is that of the global batch;
the weight and bias gradients stay local sums, which the DistributedOptimizer
reduces like any other gradient. Works on CPU tensors (Horovod's needs CUDA).
"""

import torch
import torch.nn.functional as F
from torch.nn.modules.batchnorm import _BatchNorm

from hvdlite.common import dtypes, exceptions
from hvdlite.common.basics import size
from hvdlite.common.process_sets import global_process_set
from hvdlite.torch import mpi_ops


def _channel_view(t, ndim):
    return t.reshape([1, -1] + [1] * (ndim - 2))


def _allreduce_sum(t, process_set):
    return mpi_ops.synchronize(mpi_ops.allreduce_async_(t, op=dtypes.Sum, process_set=process_set))


class _SyncBatchNormFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, running_mean, running_var, eps, momentum, process_set):
        dims = [0] + list(range(2, x.dim()))
        channels = x.shape[1]
        x64 = x.detach().to(torch.float64)
        local_count = x.numel() // channels if channels else 0
        count_t = torch.tensor([float(local_count)], dtype=torch.float64, device=x.device)
        stats = torch.cat([x64.sum(dims), (x64 * x64).sum(dims), count_t])
        stats = _allreduce_sum(stats, process_set)
        count = stats[-1].item()
        if count <= 1:
            raise exceptions.InvalidArgumentError(
                "Expected more than 1 value per channel when training, got input size %s" % (list(x.shape),)
            )
        mean = stats[:channels] / count
        var = (stats[channels : 2 * channels] / count - mean * mean).clamp_(min=0.0)
        if running_mean is not None:
            running_mean.mul_(1.0 - momentum).add_(mean.to(running_mean.dtype), alpha=momentum)
            running_var.mul_(1.0 - momentum).add_(
                (var * count / (count - 1)).to(running_var.dtype), alpha=momentum
            )
        invstd = torch.rsqrt(var + eps)
        x_hat = (x64 - _channel_view(mean, x.dim())) * _channel_view(invstd, x.dim())
        out = x_hat
        if weight is not None:
            out = out * _channel_view(weight.detach().to(torch.float64), x.dim())
        if bias is not None:
            out = out + _channel_view(bias.detach().to(torch.float64), x.dim())
        ctx.save_for_backward(x_hat, invstd, weight)
        ctx.count, ctx.process_set, ctx.has_bias = count, process_set, bias is not None
        return out.to(x.dtype)

    @staticmethod
    def backward(ctx, grad_output):
        x_hat, invstd, weight = ctx.saved_tensors
        ndim = x_hat.dim()
        dims = [0] + list(range(2, ndim))
        dy = grad_output.to(torch.float64)
        sum_dy = dy.sum(dims)
        sum_dy_xhat = (dy * x_hat).sum(dims)
        grad_weight = sum_dy_xhat.to(weight.dtype) if weight is not None and ctx.needs_input_grad[1] else None
        grad_bias = sum_dy.to(grad_output.dtype) if ctx.has_bias and ctx.needs_input_grad[2] else None
        grad_input = None
        if ctx.needs_input_grad[0]:
            totals = _allreduce_sum(torch.cat([sum_dy, sum_dy_xhat]), ctx.process_set)
            channels = sum_dy.numel()
            mean_dy = _channel_view(totals[:channels] / ctx.count, ndim)
            mean_dy_xhat = _channel_view(totals[channels:] / ctx.count, ndim)
            scale = _channel_view(invstd, ndim)
            if weight is not None:
                scale = scale * _channel_view(weight.detach().to(torch.float64), ndim)
            grad_input = ((dy - mean_dy - x_hat * mean_dy_xhat) * scale).to(grad_output.dtype)
        return grad_input, grad_weight, grad_bias, None, None, None, None, None


class SyncBatchNorm(_BatchNorm):
    """Drop-in for torch.nn.BatchNorm1d/2d/3d that normalizes with the
    statistics of the global batch across the ranks of `process_set`."""

    def __init__(
        self,
        num_features,
        eps=1e-5,
        momentum=0.1,
        affine=True,
        track_running_stats=True,
        process_set=global_process_set,
    ):
        super().__init__(num_features, eps, momentum, affine, track_running_stats)
        self.process_set = process_set

    def _check_input_dim(self, input):
        if input.dim() < 2:
            raise exceptions.InvalidArgumentError(f"expected at least 2D input (got {input.dim()}D input)")

    def _average_factor(self):
        if not (self.training and self.track_running_stats):
            return 0.0
        tracked = self.num_batches_tracked  # a tensor whenever track_running_stats is True
        if tracked is None:
            return 0.0
        tracked.add_(1)
        if self.momentum is None:  # cumulative moving average
            return 1.0 / float(tracked)
        return self.momentum

    def forward(self, input):
        self._check_input_dim(input)
        factor = self._average_factor()
        use_batch_stats = self.training or (self.running_mean is None and self.running_var is None)
        track = self.running_mean if not self.training or self.track_running_stats else None
        track_var = self.running_var if not self.training or self.track_running_stats else None
        members = self.process_set.size() if self.process_set.process_set_id else size()
        if not use_batch_stats or members == 1:
            return F.batch_norm(
                input, track, track_var, self.weight, self.bias, use_batch_stats, factor, self.eps
            )
        return _SyncBatchNormFunction.apply(
            input, self.weight, self.bias, track, track_var, self.eps, factor, self.process_set
        )
