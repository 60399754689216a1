"""Post-to-arrival latency of a small point-to-point send whose receiver already waits, the
case on a pipeline's critical path:

    python -m hvdlite.runner.launch -np 4 python benchmarks/p2p_latency.py [--sends 150] [--compute-ms 10]

Even ranks send to the next odd rank (pairs 0->1, 2->3, ... at once). A sender computes
(sleeps --compute-ms) between sends, so its engine is idle when it posts, as a pipeline stage's
is after a forward; a receiver waits in recv the whole time. Each message carries its send's
wall-clock time (the ranks share the host's clock), so the receiver measures post to arrival.
Rank 0 prints the median, p10 and p90 over every pair (the first 5 sends of each not counted).
One library only: compare builds by running it alternately from each tree, with the load shown.
"""

import argparse
import statistics
import time

import torch

import hvdlite.torch as hvd


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sends", type=int, default=150)
    parser.add_argument("--compute-ms", type=float, default=10.0)
    args = parser.parse_args()
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    if size % 2:
        raise SystemExit("p2p_latency needs an even number of ranks (sender/receiver pairs)")
    latencies_ms = []
    hvd.barrier()
    for _ in range(args.sends):
        if rank % 2 == 0:
            time.sleep(args.compute_ms / 1e3)
            stamp = torch.tensor([time.time()], dtype=torch.float64)
            hvd.synchronize(hvd.send_async(stamp, rank + 1, tag=1))
        else:
            got = torch.zeros(1, dtype=torch.float64)
            hvd.recv(got, rank - 1, tag=1)
            latencies_ms.append((time.time() - got[0].item()) * 1e3)
    everyone = hvd.allgather_object(latencies_ms[5:], name="p2p_latency")
    if rank == 0:
        values = sorted(v for per_rank in everyone for v in per_rank)
        print(
            "p2p post-to-arrival, %d ranks, %d sends per pair, %.0f ms compute between sends: "
            "median %.3f ms, p10 %.3f, p90 %.3f"
            % (
                size,
                args.sends,
                args.compute_ms,
                statistics.median(values),
                values[len(values) // 10],
                values[len(values) * 9 // 10],
            ),
            flush=True,
        )
    hvd.shutdown()


if __name__ == "__main__":
    main()
