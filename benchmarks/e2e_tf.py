"""End-to-end TensorFlow training step time: hvdlite.tensorflow's DistributedGradientTape.

    python benchmarks/e2e_tf.py               # 20 timed steps per row
    python benchmarks/e2e_tf.py --quick       # 3 steps: a smoke run

Issue 6's table: the mlp of e2e_torch.py (64 -> 4096 -> 4096 -> 2048 -> 10, 25.4M parameters,
102 MB of float32 gradients) as a Keras 3 model, batch 32 per rank, one TensorFlow thread per
rank (intra- and inter-op), the step a tf.function. Rows (the 2-rank ones side by side on the
2 cores):
  single        1 process, no communication
  nocomm        2 processes, each training alone (the floor for 2 ranks)
  hvdlite       hvd.DistributedGradientTape (one fused grouped allreduce per step)
  hvdlite-fp16  the same with Compression.fp16
Timing, idle wait, table and plot as in e2e_torch.py (whose run_row and write_report this
reuses). Writes OUT/e2e_tf.md and .png. Nothing is asserted: speed is a benchmark, not a test.
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _launch import HERE, add_driver_args
from e2e_torch import ROWS as TORCH_ROWS
from e2e_torch import run_row, write_report

WORKER = os.path.join(HERE, "_e2e_tf_worker.py")
ROWS = {row: TORCH_ROWS[row] for row in ("single", "nocomm", "hvdlite", "hvdlite-fp16")}


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=20, help="timed steps per row")
    add_driver_args(p, idle_wait=30.0, quick="3 steps, 2 s idle wait: a smoke run")
    p.add_argument("--rows", nargs="+", default=list(ROWS), choices=list(ROWS))
    return p.parse_args(argv)


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    idle_wait = 2.0 if args.quick else args.idle_wait
    steps = 3 if args.quick else args.steps
    results = []
    for row in args.rows:
        results.append(run_row(row, "mlp", steps, idle_wait, rows=ROWS, worker=WORKER))
        print("  %s" % results[-1], flush=True)
    write_report(results, args.out_dir, "e2e_tf", "TensorFlow", "One TensorFlow thread per rank")
    return 1 if any("error" in r for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
