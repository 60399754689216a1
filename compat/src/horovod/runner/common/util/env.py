"""Horovod's horovod.runner.common.util.env helpers, for hvdlite's compatibility namespace
(Horovod's test_tensorflow_process_sets.py imports get_env_rank_and_size from here)."""

import os


def get_env_rank_and_size():
    """(rank, size) from the launcher's environment: HOROVOD_RANK/SIZE (hvdliterun and horovodrun
    set them), else Open MPI's or PMI's; (0, 1) when none is set. RuntimeError when only one of a
    pair is set."""
    for rank_var, size_var in (
        ("HOROVOD_RANK", "HOROVOD_SIZE"),
        ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"),
        ("PMI_RANK", "PMI_SIZE"),
    ):
        rank, size = os.environ.get(rank_var), os.environ.get(size_var)
        if rank is not None and size is not None:
            return int(rank), int(size)
        if rank is not None or size is not None:
            raise RuntimeError(
                "Could not determine process rank and size: only one of %s and %s found in environment"
                % (rank_var, size_var)
            )
    return 0, 1
