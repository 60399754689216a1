"""hvdliterun --mpi's pieces that need no MPI: the mpirun command, its environment, and
the rebuilding of whole per-rank lines from mpirun's tagged output."""

import io

from hvdlite.runner import mpi_launch
from hvdlite.runner.output import Console


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


def _demuxed(chunks):
    """What a pipe shows of mpirun's stdout `chunks` after hvdliterun --mpi's forwarding."""
    out = io.BytesIO()
    demux = mpi_launch._Demux(Console(out, io.BytesIO()).stdout)
    for chunk in chunks:
        demux.feed(chunk)
    demux.feed(b"", final=True)
    return out.getvalue().decode().splitlines()


def test_interleaved_tagged_output_becomes_whole_lines():
    assert _demuxed(
        [
            b"[7,0]<stdout>:sum [7,1]<stdout>:sum [7,0]<stdout>:3.0\n",
            b"[7,1]<stdout>:6.0\n",
            b"a message of mpirun's own\n",
            b"[7,2]<stdout>:no newline at exit",
        ]
    ) == [
        "[0]<stdout>:sum 3.0",
        "[1]<stdout>:sum 6.0",
        "a message of mpirun's own",
        "[2]<stdout>:no newline at exit",
    ]


def test_tags_cut_by_a_read_and_bars_without_newlines():
    # Open MPI tags every piece a rank wrote: a '\r' bar arrives as tagged pieces without '\n',
    # interleaved with the other rank's; our reads may cut a tag anywhere.
    stream = (
        b"".join(b"[1,%d]<stdout>:\rbar %d/3" % (r, i) for i in range(4) for r in (0, 1))
        + b"[1,0]<stdout>:\n[1,1]<stdout>:\n[1,0]<stdout>:[x] done\n"
    )
    for cut in range(1, 20):
        chunks = [stream[i : i + cut] for i in range(0, len(stream), cut)]
        assert _demuxed(chunks) == ["[0]<stdout>:bar 3/3", "[1]<stdout>:bar 3/3", "[0]<stdout>:[x] done"], cut
