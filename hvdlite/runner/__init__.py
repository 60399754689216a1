"""hvdlite.runner: the `hvdliterun` launcher (launch.py) and the local job it runs (job.py).

The contract with the ranks is only environment variables, written through the one table of
hvdlite/common/job.py (jobenv.rank_env): any other launcher that sets
HVDLITE_RANK/SIZE/LOCAL_RANK/LOCAL_SIZE/CROSS_RANK/CROSS_SIZE, HVDLITE_STORE_ADDR and
HVDLITE_SECRET works the same; torchrun's and srun's own variables are read by hvd.init()
(hvdlite/common/launchers.py, docs/launchers.md).
"""
