"""The opt-in Horovod compatibility namespace (compat/, distribution hvdlite-horovod-compat), as a
user gets it: built and installed by pip (into a throwaway --target directory, never this venv),
then used by Python subprocesses whose path holds that directory and this checkout. Nothing
here imports `horovod` into the pytest process, so no other test sees the namespace."""

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
COMPAT = REPO / "compat"
HAVE_TF = importlib.util.find_spec("tensorflow") is not None  # no import: collection stays fast


def _env(*path_dirs):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HVDLITE_", "HOROVOD_"))}
    env["PYTHONPATH"] = os.pathsep.join([str(d) for d in path_dirs] + [str(REPO)])
    env["TF_CPP_MIN_LOG_LEVEL"] = "3"
    return env


def _pip_install(target, *path_dirs):
    cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-build-isolation", "--no-deps", "--no-index"]
    return subprocess.run(
        cmd + ["--target", str(target), str(COMPAT)],
        env=_env(*path_dirs),
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """The directory pip installed hvdlite-horovod-compat into (horovod/, bin/horovodrun)."""
    target = tmp_path_factory.mktemp("compat-install")
    out = _pip_install(target)
    assert out.returncode == 0, out.stdout + out.stderr
    assert (target / "horovod" / "__init__.py").is_file()
    assert (target / "bin" / "horovodrun").is_file()
    return target


@pytest.fixture(scope="module")
def fake_real_horovod(tmp_path_factory):
    """A directory holding the metadata of an installed distribution named `horovod`, as
    `pip install horovod` leaves it: what the refusal looks for."""
    d = tmp_path_factory.mktemp("real-horovod")
    info = d / "horovod-0.28.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: horovod\nVersion: 0.28.1\n")
    return d


def _python(code, *path_dirs, timeout=120):
    return subprocess.run(
        [sys.executable, "-c", code], env=_env(*path_dirs), capture_output=True, text=True, timeout=timeout
    )


def _json(code, *path_dirs):
    out = _python(code, *path_dirs)
    assert out.returncode == 0, out.stdout + out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


_IDENTITY = """
import json, sys, importlib
pairs = %r
got = {}
for h, t in pairs:
    hm, tm = importlib.import_module(h), importlib.import_module(t)
    got[h] = [hm is tm, sys.modules[h] is tm, hm.__name__, hm.__spec__.name]
import horovod
got["attr"] = horovod.torch is sys.modules["hvdlite.torch"] if "hvdlite.torch" in sys.modules else None
# No hvdlite source file may be loaded twice (once under a horovod name).
files = {}
for name, m in list(sys.modules.items()):
    f = getattr(m, "__file__", None)
    if f and "hvdlite" in f:
        files.setdefault(f, set()).add(id(m))
got["duplicates"] = sorted(f for f, ids in files.items() if len(ids) > 1)
print(json.dumps(got))
"""


def test_torch_and_common_aliases_are_hvdlite_modules(installed):
    pairs = [
        ("horovod.torch", "hvdlite.torch"),
        ("horovod.torch.mpi_ops", "hvdlite.torch.mpi_ops"),
        ("horovod.common.exceptions", "hvdlite.common.exceptions"),
        ("horovod.common.process_sets", "hvdlite.common.process_sets"),
        ("horovod.spark", "hvdlite.spark"),  # horovod.spark.run (pyspark is imported by run())
        ("horovod.ray", "hvdlite.ray"),  # horovod.ray.RayExecutor (ray is imported by start())
        ("horovod.ray.elastic", "hvdlite.ray.elastic"),  # ElasticRayExecutor
        ("horovod.ray.elastic_v2", "hvdlite.ray.elastic_v2"),  # ElasticAdapter
        ("horovod.ray.runner", "hvdlite.ray.runner"),  # RayExecutor, MiniSettings
        ("horovod.ray.strategy", "hvdlite.ray.strategy"),  # ColocatedStrategy, PGStrategy
        ("horovod.ray.worker", "hvdlite.ray.worker"),  # BaseHorovodWorker
        ("horovod.ray.ray_logger", "hvdlite.ray.ray_logger"),  # log() for the callbacks
    ]
    got = _json(_IDENTITY % (pairs,), installed)
    for h, t in pairs:
        assert got[h] == [True, True, t, t], h
    assert got["attr"] is True
    assert got["duplicates"] == []


# Horovod 0.28.1's public names per horovod.ray module, as its users import them.
_RAY_NAMES = {
    "horovod.ray": ["RayExecutor", "BaseHorovodWorker", "ElasticRayExecutor"],
    "horovod.ray.runner": ["RayExecutor", "MiniSettings", "Coordinator"],
    "horovod.ray.strategy": ["BaseStrategy", "ColocatedStrategy", "PGStrategy", "create_placement_group"],
    "horovod.ray.worker": ["BaseHorovodWorker"],
    "horovod.ray.elastic": ["ElasticRayExecutor", "RayHostDiscovery"],
    "horovod.ray.elastic_v2": ["ElasticAdapter", "RayHostDiscovery"],
    "horovod.ray.ray_logger": ["configure", "log"],
}


def test_horovod_ray_modules_have_horovods_public_names(installed):
    """`from horovod.ray.runner import RayExecutor` and the like import, without importing ray,
    and name one class wherever Horovod re-exports it."""
    code = (
        "import importlib, json, sys\n"
        "names = %r\n"
        "got = {m: [n for n in ns if not hasattr(importlib.import_module(m), n)] for m, ns in names.items()}\n"
        "from horovod.ray import RayExecutor, BaseHorovodWorker\n"
        "from horovod.ray.runner import RayExecutor as R\n"
        "from horovod.ray.worker import BaseHorovodWorker as W\n"
        "got['same'] = [R is RayExecutor, W is BaseHorovodWorker]\n"
        "got['ray_imported'] = 'ray' in sys.modules\n"
        "print(json.dumps(got))\n"
    ) % (_RAY_NAMES,)
    got = _json(code, installed)
    assert got.pop("same") == [True, True]
    assert got.pop("ray_imported") is False
    assert got == {m: [] for m in _RAY_NAMES}


@pytest.mark.skipif(not HAVE_TF, reason="tensorflow is not installed")
@pytest.mark.slow  # (default suite's 5-minute budget: CI runs it)
def test_tensorflow_and_keras_aliases_are_hvdlite_modules(installed):
    pairs = [
        ("horovod.tensorflow", "hvdlite.tensorflow"),
        ("horovod.tensorflow.keras", "hvdlite.tensorflow.keras"),
        ("horovod.tensorflow.keras.callbacks", "hvdlite.tensorflow.keras.callbacks"),
        ("horovod.keras", "hvdlite.tensorflow.keras"),
        ("horovod.keras.callbacks", "hvdlite.tensorflow.keras.callbacks"),
    ]
    got = _json(_IDENTITY % (pairs,), installed)
    for h, t in pairs:
        assert got[h] == [True, True, t, t], h
    assert got["duplicates"] == []


def test_one_exception_family(installed):
    code = """
import json
import horovod.torch as hvd
from horovod.common.exceptions import HorovodInternalError, HostsUpdatedInterrupt
import hvdlite.common.exceptions as ex
try:
    raise ex.HvdliteTimeoutError("peer gone")
except HorovodInternalError as e:
    caught = type(e).__name__
print(json.dumps([HorovodInternalError is hvd.HorovodInternalError is ex.HorovodInternalError,
                  HostsUpdatedInterrupt is hvd.HostsUpdatedInterrupt, caught,
                  issubclass(HorovodInternalError, RuntimeError)]))
"""
    assert _json(code, installed) == [True, True, "HvdliteTimeoutError", True]


def test_missing_module_under_an_alias_says_so(installed):
    out = _python("import horovod.torch.no_such_module", installed)
    assert out.returncode == 1
    assert "ModuleNotFoundError" in out.stderr
    assert "maps it to 'hvdlite.torch.no_such_module', which hvdlite does not have" in out.stderr


_ALLREDUCE = """
import os, torch
import horovod.torch as hvd
hvd.init()
total = hvd.allreduce(torch.tensor([hvd.rank() + 1.0]), op=hvd.Sum)
print("rank", hvd.rank(), "of", hvd.size(), "sum", total.item(), "fusion", os.environ["HVDLITE_FUSION_THRESHOLD"])
hvd.shutdown()
"""


def test_horovodrun_runs_a_two_rank_horovod_torch_script(installed, tmp_path):
    script = tmp_path / "allreduce.py"
    script.write_text(_ALLREDUCE)
    cmd = [str(installed / "bin" / "horovodrun"), "-np", "2", "-H", "localhost:2", "--start-timeout", "60"]
    cmd += ["--fusion-threshold-mb", "8", "--network-interface", "lo", sys.executable, str(script)]
    out = subprocess.run(cmd, env=_env(installed), capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    for r in range(2):
        assert "[%d]<stdout>:rank %d of 2 sum 3.0 fusion %d" % (r, r, 8 << 20) in out.stdout
    assert "has no effect" not in out.stderr  # --network-interface lo: the ranks listen on lo


_ELASTIC_SCRIPT = """
import os, signal
import horovod.torch as hvd

hvd.init()
state = hvd.elastic.ObjectState(step=0)


@hvd.elastic.run
def train(state):
    while state.step < 10:
        if state.step == 4 and os.environ["HVDLITE_ELASTIC_WORKER_ID"] == "127.0.0.2[0]":
            os.kill(os.getpid(), signal.SIGKILL)
        hvd.allreduce(__import__("torch").ones(2), name="g")
        state.step += 1
        state.commit()


train(state)
print("finished", state.step, "size", hvd.size())
"""


@pytest.mark.slow  # (default suite's 5-minute budget: CI runs it)
def test_horovodrun_elastic_flags_reach_hvdliteruns_driver(installed, tmp_path):
    script = tmp_path / "elastic.py"
    script.write_text(_ELASTIC_SCRIPT)
    cmd = [str(installed / "bin" / "horovodrun"), "-np", "3", "--min-np", "2"]
    cmd += ["-H", "localhost:1,127.0.0.1:1,127.0.0.2:1", sys.executable, str(script)]
    out = subprocess.run(cmd, env=_env(installed), capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "generation 2: 2 worker(s): localhost[0], 127.0.0.1[0]" in out.stderr
    assert "[localhost[0]]<stdout>:finished 10 size 2" in out.stdout


@pytest.mark.skipif(shutil.which("mpirun") is None, reason="mpirun is not installed")
def test_horovodrun_mpi_passes_the_hosts_to_mpirun(installed, tmp_path):
    script = tmp_path / "allreduce.py"
    script.write_text(_ALLREDUCE)
    cmd = [str(installed / "bin" / "horovodrun"), "--mpi", "-np", "2", "-H", "localhost:2"]
    cmd += ["--fusion-threshold-mb", "8", sys.executable, str(script)]
    out = subprocess.run(cmd, env=_env(installed), capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    for r in range(2):
        assert "rank %d of 2 sum 3.0 fusion %d" % (r, 8 << 20) in out.stdout


_HOROVOD_RUN = """
import horovod, torch

def main(scale):
    import horovod.torch as hvd  # a function defined in __main__ travels by value (cloudpickle)
    hvd.init()
    total = hvd.allreduce(torch.tensor([float(hvd.rank() + 1)]), op=hvd.Sum).item()
    return total * scale + hvd.rank()

if __name__ == "__main__":
    print("results", horovod.run(main, args=(10,), np=2, use_gloo=True))
"""


def test_horovod_run_returns_every_ranks_result_in_rank_order(installed, tmp_path):
    script = tmp_path / "run.py"
    script.write_text(_HOROVOD_RUN)
    out = subprocess.run(
        [sys.executable, str(script)], env=_env(installed), capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "results [30.0, 31.0]" in out.stdout


_TEST_UTILS = """
import json, os, threading
from horovod.runner.util.threads import in_thread, on_event
from horovod.runner.common.util.env import get_env_rank_and_size
got = []
in_thread(got.append, args=(1,)).join(10)
event = threading.Event()
thread = on_event(event, got.append, args=(2,), check_stop_interval_s=0.05)
event.set()
thread.join(10)
try:
    in_thread(got.append, args=3)
except ValueError:
    got.append("ValueError")
os.environ.update(HOROVOD_RANK="1", HOROVOD_SIZE="2")
print(json.dumps([got, get_env_rank_and_size()]))
"""


def test_horovods_runner_helpers_for_its_tests(installed):
    """horovod.runner.util.threads and horovod.runner.common.util.env: what Horovod's own test
    utilities import (tests/horovod_suite.py runs those tests)."""
    assert _json(_TEST_UTILS, installed) == [[1, 2, "ValueError"], [1, 2]]


_COMMON_UTIL = """
import json, os
from horovod.common import util
from horovod.common.util import _cache, env, extension_available, gloo_built, mpi_built
import horovod.torch as hvd
calls = []

@_cache
def f(x):
    calls.append(x)
    return x * 2

os.environ["HVD_T_KEEP"] = "old"
with env(HVD_T_KEEP="new", HVD_T_NEW="1", HVD_T_NONE=None):
    inside = [os.environ["HVD_T_KEEP"], os.environ["HVD_T_NEW"], "HVD_T_NONE" in os.environ]
after = [os.environ["HVD_T_KEEP"], "HVD_T_NEW" in os.environ]
print(json.dumps({
    "cache": [f(2), f(2), calls], "inside": inside, "after": after,
    "ext": [extension_available("torch"), extension_available("mxnet")],
    "gloo": gloo_built(), "mpi": mpi_built() == hvd.mpi_built(),
    "helpers": [util.num_rank_is_power_2(4), util.is_iterable(3), util.split_list([1, 2, 3, 4], 2),
                util.is_version_greater_equal_than("0.28.1", "0.28.0")],
    "basics": hvd.mpi_ops._basics.init is hvd.init,
}))
"""


def test_horovod_common_util_offers_what_horovods_tests_import(installed):
    got = _json(_COMMON_UTIL, installed)
    assert got["cache"] == [4, 4, [2]]
    assert got["inside"] == ["new", "1", False] and got["after"] == ["old", False]
    assert got["ext"] == [True, False]
    assert got["gloo"] is True and got["mpi"] is True
    assert got["helpers"] == [True, False, [[1, 2], [3, 4]], True]
    assert got["basics"] is True


def test_horovodrun_version_and_check_build(installed):
    run = str(installed / "bin" / "horovodrun")
    out = subprocess.run([run, "--version"], env=_env(installed), capture_output=True, text=True, timeout=60)
    assert (out.returncode, out.stdout.strip()) == (0, "0.28.1")
    out = subprocess.run([run, "-cb"], env=_env(installed), capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "PyTorch" in out.stdout or "torch" in out.stdout.lower()


@pytest.mark.parametrize(
    "args, message",
    [
        (["-np", "4", "-H", "localhost:2"], "-np 4 is more than the 2 slots"),
        (["-np", "2", "--min-np", "1", "--mpi"], "elastic training runs under hvdliterun's driver"),
        (["-np", "2", "--jsrun"], "no the jsrun controller"),
        (["-np", "2", "--gloo", "--mpi"], "--gloo and --mpi exclude each other"),
    ],
)
def test_horovodrun_refuses_what_it_cannot_run(installed, args, message):
    cmd = [str(installed / "bin" / "horovodrun"), *args, sys.executable, "-c", "pass"]
    out = subprocess.run(cmd, env=_env(installed), capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
    assert message in out.stderr


def test_horovodrun_flag_translation(installed, tmp_path):
    hostfile = tmp_path / "hosts"
    hostfile.write_text("# two nodes\na slots=2\nb slots=2\n")
    code = """
import json, sys
from horovod.runner.launch import translate
print(json.dumps([translate(a) for a in json.loads(sys.argv[1])]))
"""
    cases = [
        ["--mpi", "-np", "4", "-H", "a:2,b:2", "--mpi-args=--bind-to core", "python", "t.py", "--lr", "1"],
        ["--mpi", "-np", "4", "--hostfile", str(hostfile), "python", "t.py"],
        ["-np", "2", "--disable-cache", "--cycle-time-ms", "2.5", "--log-level", "DEBUG", "--no-stall-check"]
        + ["--stall-check-shutdown-time-seconds", "30", "--timeline-filename", "t.json", "--verbose"]
        + ["--hierarchical-allreduce", "--no-hierarchical-allgather", "x"],
        ["-np", "3", "--min-np", "2", "--max-np", "4", "--blacklist-cooldown-range", "10", "20"]
        + ["--reset-limit", "3", "-H", "localhost:1,127.0.0.2:2", "python", "t.py"],
        ["-np", "2", "-H", "node7:1,node8", "-p", "2222", "-i", "k", "--network-interface", "eth0"]
        + ["--output-filename", "o", "x"],
    ]
    out = subprocess.run(
        [sys.executable, "-c", code, json.dumps(cases)],
        env=_env(installed),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    mpi_hosts, mpi_hostfile, tunables, elastic, ssh_hosts = json.loads(out.stdout)
    assert elastic[0] == ["-np", "3", "--min-np", "2", "--max-np", "4", "--reset-limit", "3"] + [
        "--blacklist-cooldown-range",
        "10",
        "20",
        "-H",
        "localhost:1,127.0.0.2:2",
        "python",
        "t.py",
    ]
    # Without --mpi, hosts and the ssh / NIC flags go to hvdliterun, which starts remote ranks.
    assert ssh_hosts[0] == ["-np", "2", "-H", "node7:1,node8:1", "--ssh-port", "2222"] + [
        "--ssh-identity-file",
        "k",
        "--network-interfaces",
        "eth0",
        "--output-filename",
        "o",
        "x",
    ]
    assert ssh_hosts[2] == []
    assert mpi_hosts[0] == ["-np", "4", "--mpi", "--mpi-args", "-H a:2,b:2 --bind-to core"] + [
        "python",
        "t.py",
        "--lr",
        "1",
    ]
    assert mpi_hosts[1] == {}
    assert mpi_hostfile[0] == [
        "-np",
        "4",
        "--mpi",
        "--mpi-args",
        "--hostfile %s" % hostfile,
        "python",
        "t.py",
    ]
    assert tunables[0] == ["-np", "2", "--verbose", "--timeline-filename", "t.json", "x"]
    assert tunables[1] == {
        "HVDLITE_CACHE_CAPACITY": "0",
        "HVDLITE_CYCLE_TIME": "2.5",
        "HVDLITE_HIERARCHICAL_ALLREDUCE": "1",
        "HVDLITE_HIERARCHICAL_ALLGATHER": "0",
        "HVDLITE_LOG_LEVEL": "debug",
        "HVDLITE_STALL_CHECK_DISABLE": "1",
        "HVDLITE_STALL_SHUTDOWN_TIME_SECONDS": "30",
    }


def test_import_refused_over_a_real_horovod(installed, fake_real_horovod):
    out = _python("import horovod.torch", installed, fake_real_horovod)
    assert out.returncode == 1
    assert (
        "ImportError: hvdlite's Horovod compatibility namespace refuses to run over a real Horovod"
        in out.stderr
    )
    assert str(fake_real_horovod) in out.stderr


def test_install_refused_over_a_real_horovod(tmp_path, fake_real_horovod):
    out = _pip_install(tmp_path / "target", fake_real_horovod)
    assert out.returncode != 0
    assert "refuses to install over a real Horovod: horovod 0.28.1" in out.stdout + out.stderr
    assert not (tmp_path / "target" / "horovod").exists()


def test_offline_mnist_reads_back_through_the_standins(tmp_path):
    """compat/examples/run_offline.py's synthetic MNIST, read as Horovod's PyTorch example reads it
    (the stand-in torchvision) and as its Keras examples do (the swapped mnist.load_data)."""
    runner = COMPAT / "examples" / "run_offline.py"
    code = """
import json, runpy, sys
from pathlib import Path
m = runpy.run_path(sys.argv[1])
npz = m["write_data"](Path(sys.argv[2]))
import os
os.environ["HVDLITE_OFFLINE_MNIST_NPZ"] = str(npz)
from torchvision import datasets, transforms
ds = datasets.MNIST(sys.argv[2], train=False, transform=transforms.Compose([transforms.ToTensor()]))
img, label = ds[0]
x_train, y_train, x_test, y_test = m["synthetic_mnist"]()
print(json.dumps([len(ds), list(img.shape), label == int(y_test[0]), 0.5 < float(img.max()) <= 1.0, len(x_train)]))
"""
    standins = COMPAT / "examples" / "standins"
    out = subprocess.run(
        [sys.executable, "-c", code, str(runner), str(tmp_path / "data")],
        env=_env(standins),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.strip().splitlines()[-1]) == [256, [1, 28, 28], True, True, 1024]


def test_python_dash_m_runs_an_aliased_module(installed):
    """`python -m horovod.<aliased module>` runs the hvdlite module as __main__ (as
    `python -m horovod.tensorflow.data.compute_worker CONFIGFILE` does), with its file as argv[0]."""
    out = subprocess.run(
        [sys.executable, "-m", "horovod.common.exceptions"],
        env=_env(installed),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    code = (
        "import horovod, importlib.util; print(importlib.util.find_spec('horovod.common.exceptions').origin)"
    )
    assert _python(code, installed).stdout.strip().endswith("hvdlite/common/exceptions.py")  # runpy's argv[0]


_COMPUTE = """
import json
from horovod.runner.common.service.compute_service import ComputeClient, ComputeService
from horovod.runner.common.util import secret
key = secret.make_secret_key()
service = ComputeService(1, 1, key=key)
client = ComputeClient(service.addresses(), key)
client.register_dispatcher(0, "grpc://localhost:1")
address = client.wait_for_dispatcher_registration(0, 5)
service.shutdown()
print(json.dumps([len(key), address, secret.check_digest(key, b"m", secret.compute_digest(key, b"m"))]))
"""


def test_horovods_compute_service_and_secret(installed):
    """horovod.runner.common.service.compute_service (hvdlite's compute service, which
    horovod.tensorflow.data uses) and horovod.runner.common.util.secret."""
    assert _json(_COMPUTE, installed) == [32, "grpc://localhost:1", True]
