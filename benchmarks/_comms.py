"""One small adapter per library, so a benchmark rank runs the same code against each.

    comm = make_comm("hvdlite" | "gloo" | "mpi" | "horovod")   # joins the job its launcher started
    comm.rank, comm.size, comm.version, comm.barrier(), comm.close()
    comm.allreduce(buf)               # in place, Sum
    comm.broadcast(buf)               # in place, root 0
    comm.allgather(inp, out)          # returns the gathered array (out, or one the library made)
    comm.alltoall(inp, out)           # even split of dim 0; returns the output array
    comm.reducescatter(inp, out)      # Sum; returns this rank's block
    comm.allreduce_async(buf, i) -> handle;  comm.wait_all(handles)   # fusion benchmark
    comm.agree_max(x)                 # max of a float over ranks (an allgather: every peer has one)

Contracts: buffers are C-contiguous float32 NumPy arrays the caller owns; `out` is preallocated
with the right size (libraries that allocate their own output ignore it, as their users would).
Torch-based peers wrap the arrays with torch.from_numpy (shared memory, no copy). Every adapter
sets one compute thread per rank (torch.set_num_threads(1); OMP_NUM_THREADS comes from the
driver). Importing this module imports no library: each is imported by its adapter only, so a
rank in Horovod's venv never needs hvdlite and the other way round.
"""

import os


class HvdliteComm:
    """hvdlite's NumPy API; the rank joins through the HVDLITE_* variables its launcher set."""

    def __init__(self):
        import hvdlite as hvd

        self.hvd = hvd
        hvd.init()
        self.rank, self.size = hvd.rank(), hvd.size()
        self.version = "hvdlite " + hvd.__version__

    def barrier(self):
        self.hvd.barrier()

    def allreduce(self, buf):
        return self.hvd.allreduce_(buf, op=self.hvd.Sum, name="bench.allreduce.%d" % buf.size)

    def broadcast(self, buf):
        return self.hvd.broadcast_(buf, 0, name="bench.broadcast.%d" % buf.size)

    def allgather(self, inp, out):
        return self.hvd.allgather(inp, name="bench.allgather.%d" % inp.size)

    def alltoall(self, inp, out):
        return self.hvd.alltoall(inp, name="bench.alltoall.%d" % inp.size)

    def reducescatter(self, inp, out):
        return self.hvd.reducescatter(inp, op=self.hvd.Sum, name="bench.reducescatter.%d" % inp.size)

    def allreduce_async(self, buf, index):
        return self.hvd.allreduce_async_(buf, op=self.hvd.Sum, name="bench.fusion.%d" % index)

    def wait_all(self, handles):
        for h in handles:
            self.hvd.synchronize(h)

    def close(self):
        self.hvd.shutdown()


class GlooComm:
    """torch.distributed with the gloo backend over 127.0.0.1; the driver sets RANK, WORLD_SIZE
    and BENCH_GLOO_INIT (a tcp:// init method)."""

    def __init__(self):
        import torch
        import torch.distributed as dist

        torch.set_num_threads(1)
        self.torch, self.dist = torch, dist
        self.rank, self.size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        dist.init_process_group(
            "gloo", init_method=os.environ["BENCH_GLOO_INIT"], rank=self.rank, world_size=self.size
        )
        self.version = "torch %s gloo" % torch.__version__

    def _t(self, array):
        return self.torch.from_numpy(array)

    def barrier(self):
        self.dist.barrier()

    def allreduce(self, buf):
        self.dist.all_reduce(self._t(buf))
        return buf

    def broadcast(self, buf):
        self.dist.broadcast(self._t(buf), 0)
        return buf

    def allgather(self, inp, out):
        self.dist.all_gather_into_tensor(self._t(out), self._t(inp))
        return out

    def alltoall(self, inp, out):
        self.dist.all_to_all_single(self._t(out), self._t(inp))
        return out

    def reducescatter(self, inp, out):
        self.dist.reduce_scatter_tensor(self._t(out), self._t(inp))
        return out

    def allreduce_async(self, buf, index):
        return self.dist.all_reduce(self._t(buf), async_op=True)

    def wait_all(self, handles):
        for h in handles:
            h.wait()

    def close(self):
        self.dist.destroy_process_group()


class MpiComm:
    """mpi4py on Open MPI; the rank joins through mpirun. `blocking` picks the fusion
    benchmark's per-tensor mode (Allreduce) over the async one (Iallreduce + Waitall)."""

    def __init__(self, blocking=False):
        from mpi4py import MPI

        self.MPI, self.comm, self.blocking = MPI, MPI.COMM_WORLD, blocking
        self.rank, self.size = self.comm.Get_rank(), self.comm.Get_size()
        import mpi4py

        self.version = "mpi4py %s, %s" % (mpi4py.__version__, MPI.Get_library_version().split(",")[0].strip())

    def barrier(self):
        self.comm.Barrier()

    def allreduce(self, buf):
        self.comm.Allreduce(self.MPI.IN_PLACE, buf, op=self.MPI.SUM)
        return buf

    def broadcast(self, buf):
        self.comm.Bcast(buf, root=0)
        return buf

    def allgather(self, inp, out):
        self.comm.Allgather(inp, out)
        return out

    def alltoall(self, inp, out):
        self.comm.Alltoall(inp, out)
        return out

    def reducescatter(self, inp, out):
        self.comm.Reduce_scatter_block(inp, out, op=self.MPI.SUM)
        return out

    def allreduce_async(self, buf, index):
        if self.blocking:
            self.allreduce(buf)
            return None
        return self.comm.Iallreduce(self.MPI.IN_PLACE, buf, op=self.MPI.SUM)

    def wait_all(self, handles):
        if not self.blocking:
            self.MPI.Request.Waitall(handles)

    def close(self):
        pass  # mpi4py finalizes at exit


class HorovodComm:
    """horovod.torch (0.28.1, gloo controller) on torch tensors; the rank joins through
    horovodrun --gloo."""

    def __init__(self):
        import horovod
        import horovod.torch as hvd
        import torch

        torch.set_num_threads(1)
        self.torch, self.hvd = torch, hvd
        hvd.init()
        self.rank, self.size = hvd.rank(), hvd.size()
        self.version = "horovod %s (gloo), torch %s" % (horovod.__version__, torch.__version__)

    def _t(self, array):
        return self.torch.from_numpy(array)

    def barrier(self):
        self.hvd.barrier()

    def allreduce(self, buf):
        self.hvd.allreduce_(self._t(buf), op=self.hvd.Sum, name="bench.allreduce.%d" % buf.size)
        return buf

    def broadcast(self, buf):
        self.hvd.broadcast_(self._t(buf), 0, name="bench.broadcast.%d" % buf.size)
        return buf

    def allgather(self, inp, out):
        return self.hvd.allgather(self._t(inp), name="bench.allgather.%d" % inp.size).numpy()

    def alltoall(self, inp, out):
        return self.hvd.alltoall(self._t(inp), name="bench.alltoall.%d" % inp.size).numpy()

    def reducescatter(self, inp, out):
        return self.hvd.reducescatter(
            self._t(inp), op=self.hvd.Sum, name="bench.reducescatter.%d" % inp.size
        ).numpy()

    def allreduce_async(self, buf, index):
        return self.hvd.allreduce_async_(self._t(buf), op=self.hvd.Sum, name="bench.fusion.%d" % index)

    def wait_all(self, handles):
        for h in handles:
            self.hvd.synchronize(h)

    def close(self):
        self.hvd.shutdown()


def _agree_max(comm, value):
    """Max of `value` over the ranks of `comm`, through the library's own allgather."""
    import numpy as np

    mine = np.full(1, value, dtype=np.float32)
    return float(np.max(comm.allgather(mine, np.empty(comm.size, dtype=np.float32))))


for _cls in (HvdliteComm, GlooComm, MpiComm, HorovodComm):
    _cls.agree_max = _agree_max


def make_comm(lib):
    """Joins the job as library `lib`: hvdlite, gloo, mpi, mpi-blocking (fusion's per-tensor
    Open MPI mode) or horovod."""
    if lib == "hvdlite":
        return HvdliteComm()
    if lib == "gloo":
        return GlooComm()
    if lib in ("mpi", "mpi-blocking"):
        return MpiComm(blocking=(lib == "mpi-blocking"))
    if lib == "horovod":
        return HorovodComm()
    raise ValueError("unknown library %r" % lib)
