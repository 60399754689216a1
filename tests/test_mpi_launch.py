"""hvdliterun --mpi's pieces that need no MPI: the mpirun command, its environment, and
the rebuilding of whole per-rank lines from mpirun's tagged output."""

import io

from hvdlite.runner import mpi_launch


def test_mpirun_command_and_environment(monkeypatch):
    monkeypatch.setattr(mpi_launch, "_is_open_mpi", lambda mpirun: True)
    argv = mpi_launch.mpirun_command(3, ["python", "train.py"], "-H a:2,b:1", mpirun="mpirun")
    assert argv == [
        "mpirun",
        "-n",
        "3",
        "--oversubscribe",
        "--bind-to",
        "none",
        "--tag-output",
        "-H",
        "a:2,b:1",
        "python",
        "train.py",
    ]
    env = mpi_launch.mpirun_env(
        {
            "HVDLITE_RANK": "0",
            "HOROVOD_SIZE": "2",
            "HVDLITE_SECRET": "ab",
            "HVDLITE_FUSION_THRESHOLD": "1",
            "PATH": "/bin",
        }
    )
    assert "HVDLITE_RANK" not in env and "HOROVOD_SIZE" not in env and "HVDLITE_SECRET" not in env
    assert env["HVDLITE_FUSION_THRESHOLD"] == "1" and env["PATH"] == "/bin"


def test_interleaved_tagged_output_becomes_whole_lines():
    out = io.BytesIO()
    lines = mpi_launch._Lines(out)
    for chunk in (
        b"[7,0]<stdout>:sum [7,1]<stdout>:sum [7,0]<stdout>:3.0\n",
        b"[7,1]<stdout>:6.0\n",
        b"a message of mpirun's own\n",
        b"[7,2]<stderr>:no newline at exit",
    ):
        lines.feed(chunk)
    lines.close()
    assert out.getvalue().decode().splitlines() == [
        "[0]<stdout>:sum 3.0",
        "[1]<stdout>:sum 6.0",
        "a message of mpirun's own",
        "[2]<stderr>:no newline at exit",
    ]
