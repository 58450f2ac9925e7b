"""Which GPUs each rank sees: the rule of ``hvd_dcasgd/runtime/gpus.py`` for the node compositions each
launcher's mapping makes (blocks, ``--map-by node``, SLURM's cyclic distribution), more workers than GPUs,
one GPU, a node without a server; ``HVD_DCASGD_GPUS`` none, keep, auto and bad values; and ``init()``
setting it in a process of its own (stand-in GPU ids: no CUDA needed)."""

import itertools
import os
import shutil
import sys
import warnings

import pytest

from helpers import gpu_placement_problems, run

from hvd_dcasgd.common.config import settings
from hvd_dcasgd.common.errors import HvdDcasgdValueError, HvdDcasgdWarning
from hvd_dcasgd.runtime import gpus, roles
from hvd_dcasgd.runtime.gpus import NodeRank, assign, decide

FOUR = ("0", "1", "2", "3")


def node(roles_text, choice=FOUR, visible=None):
    """A node's ranks from ``"SWW"`` (a server, two workers, in world-rank order)."""
    return [NodeRank(letter == "S", choice, visible) for letter in roles_text]


def seen(ranks, listing=()):
    return [decide(ranks, me, listing) for me in range(len(ranks))]


def host_placement(hosts, world_size, servers, ids=FOUR):
    """Every rank's record as ``programs/pinning.py`` writes it, for ``hosts`` (host -> its world ranks)."""
    records = []
    for host, members in hosts.items():
        ranks = [NodeRank(r < servers, ids) for r in members]
        for me, r in enumerate(members):
            place = sum(1 for o in members[:me] if (o < servers) == (r < servers))
            records.append({"world_rank": r, "server": r < servers, "local_rank": place, "host": host,
                            "visible": decide(ranks, me)})
    assert sorted(rec["world_rank"] for rec in records) == list(range(world_size))
    return records


# The node compositions each mapping makes.

def test_blocks_put_the_servers_first_on_the_first_node():
    """One server, 7 workers, 4 GPUs a node, in blocks of 4: the server and workers 0-2, then workers 3-6."""
    assert seen(node("SWWW")) == ["0,1,2,3", "1,2,3,0", "1,2,3,0", "1,2,3,0"]
    assert assign([True, False, False, False], FOUR) == ["0", "1", "2", "3"]
    assert seen(node("WWWW")) == ["0,1,2,3"] * 4  # a node without a server: the workers spread over all four
    records = host_placement({"a": [0, 1, 2, 3], "b": [4, 5, 6, 7]}, 8, 1)
    assert gpu_placement_problems(records, list(FOUR)) == []


def test_map_by_node_puts_a_server_on_each_of_two_hosts():
    """``--map-by node`` with S=2 over hosts A and B: A holds ranks 0, 2, 4, 6 (server 0, workers 0, 2, 4),
    B ranks 1, 3, 5, 7 (server 1, workers 1, 3, 5).  Each host's server takes its GPU 0, its workers the others:
    worker 1, the first worker on B (hvd.local_rank() 0), sees GPU 1 at index 0, not its server's GPU 0."""
    records = host_placement({"A": [0, 2, 4, 6], "B": [1, 3, 5, 7]}, 8, 2)
    assert gpu_placement_problems(records, list(FOUR)) == []
    b = {r["world_rank"]: r["visible"] for r in records if r["host"] == "B"}
    assert b == {1: "0,1,2,3", 3: "1,2,3,0", 5: "1,2,3,0", 7: "1,2,3,0"}
    assert b[3].split(",")[0] == "1"


def test_slurm_cyclic_with_more_servers_than_nodes():
    """``srun --distribution=cyclic``, S=3 over 2 nodes of 4 tasks: node A holds servers 0 and 2 and two
    workers, node B server 1 and three workers."""
    records = host_placement({"A": [0, 2, 4, 6], "B": [1, 3, 5, 7]}, 8, 3)
    assert gpu_placement_problems(records, list(FOUR)) == []
    assert [r["visible"] for r in records if r["host"] == "A"] == ["0,1,2,3", "0,1,2,3", "2,3,0,1", "2,3,0,1"]


def test_more_workers_than_gpus_share_them_in_turn():
    ranks = node("SWWWWW")
    assert assign([r.server for r in ranks], FOUR) == ["0", "1", "2", "3", "1", "2"]
    # worker 3 sees GPU 1 at index 3; worker 4's hvd.local_rank() is past the list: its own alone, as cuda:0
    assert seen(ranks) == ["0,1,2,3", "1,2,3,0", "1,2,3,0", "1,2,3,0", "2,3,0,1", "2"]


def test_more_servers_than_gpus_and_the_workers_share_all():
    ranks = node("SSSWW", choice=("0", "1"))
    assert assign([r.server for r in ranks], ("0", "1")) == ["0", "1", "0", "0", "1"]
    assert seen(ranks) == ["0,1", "0,1", "0", "0,1", "0,1"]


def test_one_gpu_is_shared_by_every_rank():
    assert seen(node("SWWW", choice=("7",))) == ["7"] * 4
    assert seen(node("SSWW", choice=("GPU-5d1f",))) == ["GPU-5d1f"] * 4


def test_every_composition_follows_the_rule():
    """Every node of up to 6 ranks (servers and workers in any order) on 1 to 5 GPUs."""
    for size in range(1, 7):
        for letters in itertools.product("SW", repeat=size):
            for k in range(1, 6):
                ids = tuple(str(10 + i) for i in range(k))
                members = list(range(size))
                servers = {i for i, letter in enumerate(letters) if letter == "S"}
                records = []
                for me, letter in enumerate(letters):
                    place = sum(1 for o in letters[:me] if o == letter)
                    records.append({"world_rank": me, "server": me in servers, "local_rank": place, "host": "n",
                                    "visible": decide([NodeRank(i in servers, ids) for i in members], me)})
                assert gpu_placement_problems(records, list(ids)) == [], (letters, k)


# The setting.

def test_none_hides_every_gpu_and_keep_leaves_them():
    assert seen(node("SWW", choice="none", visible=FOUR)) == ["", "", ""]
    assert seen(node("SWW", choice="keep", visible=FOUR)) == [None, None, None]


def test_auto_takes_cuda_visible_devices_else_nvidia_smi_else_nothing():
    assert seen(node("SW", choice="auto", visible=("4", "5"))) == ["4,5", "5,4"]
    assert seen(node("SW", choice="auto"), listing=("0", "1")) == ["0,1", "1,0"]
    assert seen(node("SW", choice="auto")) == [None, None]  # no GPU found: nothing pinned
    assert seen(node("SW", choice="auto", visible=())) == [None, None]  # CUDA_VISIBLE_DEVICES set empty


def test_ranks_of_a_node_given_different_gpus_keep_them():
    """A cluster that gave each rank its own GPU (SLURM's per-task binding): nothing to place."""
    ranks = [NodeRank(True, "auto", ("0",)), NodeRank(False, "auto", ("1",))]
    assert seen(ranks) == [None, None]


@pytest.mark.parametrize("raw, parsed", [
    ("auto", "auto"), (" None ", "none"), ("keep", "keep"), ("0,1,2", ("0", "1", "2")), ("3", ("3",)),
    ("GPU-8e2a,MIG-1c3b", ("GPU-8e2a", "MIG-1c3b")), (" 0, 1 ", ("0", "1")),
])
def test_the_setting_reads(raw, parsed):
    assert settings({"HVD_DCASGD_GPUS": raw}).gpus == parsed
    assert settings({}).gpus == "auto"


@pytest.mark.parametrize("raw", ["0,,1", "0,0", "auto,1", "0 1", ",", "0,"])
def test_a_bad_setting_is_one_sentence(raw):
    with pytest.raises(HvdDcasgdValueError) as caught:
        settings({"HVD_DCASGD_GPUS": raw})
    assert str(caught.value) == (f"hvd_dcasgd: HVD_DCASGD_GPUS={raw!r} is not valid: use auto, none, keep, or GPU "
                                 f"ids such as 0,1,2 (numbers or UUIDs, each once).")


# init() in a process of its own.

def test_nvidia_smi_lists_one_id_per_gpu(tmp_path):
    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho 'GPU 0: NVIDIA H100 (UUID: GPU-1)'\necho '  MIG 1g.10gb Device 0'\n"
                   "echo 'GPU 1: NVIDIA H100 (UUID: GPU-2)'\n")
    smi.chmod(0o755)
    assert gpus.nvidia_smi_ids({"PATH": str(tmp_path)}) == ("0", "1")
    assert gpus.nvidia_smi_ids({"PATH": str(tmp_path / "none")}) == ()


@pytest.mark.parametrize("env, expected", [
    ({"HVD_DCASGD_GPUS": "2,3"}, "'2,3'"),
    ({"HVD_DCASGD_GPUS": "none", "CUDA_VISIBLE_DEVICES": "0"}, "''"),
    ({"HVD_DCASGD_GPUS": "", "PATH": "smi"}, "'0,1'"),  # auto: nvidia-smi's two GPUs
])
def test_init_in_one_process_sets_cuda_visible_devices(tmp_path, monkeypatch, env, expected):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    if env.get("PATH") == "smi":
        (tmp_path / "nvidia-smi").write_text("#!/bin/sh\necho 'GPU 0: A'\necho 'GPU 1: B'\n")
        (tmp_path / "nvidia-smi").chmod(0o755)
        env = {**env, "PATH": f"{tmp_path}{os.pathsep}{os.environ['PATH']}"}
    program = tmp_path / "one.py"
    program.write_text("import os, warnings\nwarnings.simplefilter('ignore')\nimport hvd_dcasgd as hvd\n"
                       "hvd.init()\nprint('sees', repr(os.environ.get('CUDA_VISIBLE_DEVICES')))\n")
    result = run([sys.executable, str(program)], env=env)
    assert result.returncode == 0, result.stdout
    assert f"sees {expected}" in result.stdout, result.stdout


def test_cuda_started_before_init_is_left_with_a_warning(monkeypatch):
    """CUDA reads CUDA_VISIBLE_DEVICES once: after it started, init() says what to do and changes nothing."""
    import torch

    monkeypatch.setenv("HVD_DCASGD_GPUS", "1,0")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        roles._pin_gpus()
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "0,1"
    assert [str(w.message) for w in caught if w.category is HvdDcasgdWarning] == [
        "hvd_dcasgd: CUDA started in this process before hvd_dcasgd.init(), so init() cannot place this rank on "
        "its GPU (CUDA_VISIBLE_DEVICES='1,0'); call hvd.init() before anything uses CUDA, or set "
        "HVD_DCASGD_GPUS=keep to leave the GPUs as they are"]
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    roles._pin_gpus()
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "1,0"


#: A stand-in for CUDA's driver: ``cuCtxGetCurrent`` answers what ``set_state`` says (3: not started).
DRIVER = """
static int state = 3;
void set_state(int value) { state = value; }
int cuCtxGetCurrent(void **context) { *context = 0; return state; }
"""
PROBE = """
import ctypes, os, sys, warnings
driver = ctypes.CDLL(sys.argv[1])  # loaded, as the CUDA runtime loads the driver (by its name libcuda.so.1)
from hvd_dcasgd.runtime.gpus import cuda_started
print("loaded, not started:", cuda_started())
driver.set_state(0)  # what cuInit leaves: torch.cuda.is_available() calls it
print("started:", cuda_started())
import hvd_dcasgd as hvd
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    hvd.init()
print("sees", repr(os.environ["CUDA_VISIBLE_DEVICES"]))
print([str(w.message) for w in caught if "CUDA started" in str(w.message)])
"""


def test_a_cuda_driver_started_before_init_is_seen_and_left(tmp_path, monkeypatch):
    """The case Horovod's own scripts make: ``torch.cuda.is_available()`` before ``hvd.init()`` starts CUDA's
    driver while torch still says it has not initialized CUDA.  A stand-in driver (a shared library named
    libcuda.so.1, loaded in the process) answers as the real one does before and after it started."""
    cc = shutil.which("cc")
    if cc is None:
        pytest.skip("no C compiler for the stand-in driver")
    (tmp_path / "driver.c").write_text(DRIVER)
    built = run([cc, "-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", "-o", str(tmp_path / "libcuda.so.1"),
                 str(tmp_path / "driver.c")])
    assert built.returncode == 0, built.stdout
    (tmp_path / "probe.py").write_text(PROBE)
    monkeypatch.delenv("HVD_DCASGD_GPUS", raising=False)
    result = run([sys.executable, str(tmp_path / "probe.py"), str(tmp_path / "libcuda.so.1")],
                 env={"HVD_DCASGD_GPUS": "1,0", "CUDA_VISIBLE_DEVICES": "0,1"})
    assert result.returncode == 0, result.stdout
    assert "loaded, not started: False\nstarted: True\nsees '0,1'\n" in result.stdout, result.stdout
    assert "CUDA started in this process before hvd_dcasgd.init()" in result.stdout, result.stdout
    assert gpus.cuda_started() is False  # this process: torch's CPU build, no driver loaded


def test_importing_the_package_keeps_is_available_from_starting_cuda(monkeypatch):
    """``PYTORCH_NVML_BASED_CUDA_CHECK=1`` (torch counts GPUs through NVML before CUDA starts), unless set."""
    probe = "import os, hvd_dcasgd; print(os.environ.get('PYTORCH_NVML_BASED_CUDA_CHECK'))"
    monkeypatch.delenv("PYTORCH_NVML_BASED_CUDA_CHECK", raising=False)
    assert run([sys.executable, "-c", probe]).stdout.strip() == "1"
    assert run([sys.executable, "-c", probe], env={"PYTORCH_NVML_BASED_CUDA_CHECK": "0"}).stdout.strip() == "0"


def test_a_server_takes_the_gpu_at_its_local_rank(monkeypatch):
    """What a server sees puts its own GPU at its hvd.local_rank() (modulo the GPUs it sees, where it sees its
    own alone): that is the device it keeps the model on, asked or not (a bare ``cuda`` too)."""
    import torch

    from hvd_dcasgd.api.optimizer import _server_device

    monkeypatch.delenv("HVD_DCASGD_SERVER_DEVICE", raising=False)
    second = roles.Runtime(role=roles.SERVER, local_rank=1)
    assert _server_device(second, None) == torch.device("cpu")  # no CUDA here
    assert _server_device(second, "cuda:0") == torch.device("cuda", 0)  # as asked
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    assert _server_device(second, None) == _server_device(second, "cuda") == torch.device("cuda", 1)
    assert _server_device(roles.Runtime(role=roles.SERVER, local_rank=2), None) == torch.device("cuda", 2)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)  # a third server on 2 GPUs sees its own alone
    assert _server_device(roles.Runtime(role=roles.SERVER, local_rank=2), None) == torch.device("cuda", 0)
    assert _server_device(second, "cpu") == torch.device("cpu")
