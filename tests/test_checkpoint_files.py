"""The checkpoint folder and the trace as files that can go wrong: damaged
checkpoints and a torn trace at resume, servers whose cuts disagree, a disk
that fills up, a second job on a folder in use, non-finite weights.  The jobs
run under the real ``mpirun`` with a timeout; write failures are real ones,
on a small tmpfs filled to the last page (the tests run as root, for whom
file permissions are no obstacle)."""

import json
import os
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch


from hvd_dcasgd.serving.checkpoints import LOCK, Checkpoints, checksum
from hvd_dcasgd.algorithm.compensation import Compensation
from hvd_dcasgd.algorithm.endpoints import open_server
from hvd_dcasgd.common.errors import HvdDcasgdError
from hvd_dcasgd.protocol.layout import ModelLayout
from hvd_dcasgd.runtime.mpi import load_mpi
from hvd_dcasgd.serving.loop import save
from hvd_dcasgd.observability.telemetry import read_trace, truncate_trace

from helpers import (PROGRAMS, TRAINING, WORKERS, Job, check_final_weights, check_history, check_resumed_sharded,
                     run_job, trace, unavailable)

sys.path.insert(0, str(PROGRAMS))
import synthetic  # noqa: E402


def _numbered(folder: Path):
    return sorted(folder.glob("checkpoint-*.pt"))


def _checkpointed_run(tmp_path, env, servers=1):
    """A whole run that wrote periodic checkpoints: the last two are kept
    (with several servers, in every server's folder)."""
    status, log = run_job(tmp_path, *TRAINING, env={**env, "HVD_DCASGD_CHECKPOINT_INTERVAL": "0.2"}, servers=servers)
    assert status == 0, log


# --- resume survives damaged files ----------------------------------------------

def _truncate(path: Path) -> str:
    data = path.read_bytes()
    path.write_bytes(data[:len(data) // 2])
    return "it cannot be read"


def _change_weights(path: Path) -> str:
    """A well-formed checkpoint whose weights are not the ones it was written
    with (a bit flipped on disk, a file edited): its checksum says so."""
    state = torch.load(path, weights_only=True)
    state["weights"][0] += 1.0
    torch.save(state, path)
    return "its content does not match the checksum stored with it"


@pytest.mark.mpi
@pytest.mark.slow
@pytest.mark.parametrize("damage", [_truncate, _change_weights], ids=["truncated", "changed"])
def test_a_damaged_newest_checkpoint_and_a_torn_trace_line_resume_exactly_from_the_one_before(tmp_path, damage):
    folder = tmp_path / "checkpoints"
    env = {"HVD_DCASGD_CHECKPOINT_DIR": str(folder), "HVD_DCASGD_TRACE": str(tmp_path / "trace")}
    _checkpointed_run(tmp_path, env)
    older, newest = _numbered(folder)
    why = damage(newest)
    with open(tmp_path / "trace", "a") as f:  # what a SIGKILL in the middle of a line leaves
        f.write('{"update": 100000, "worker": 1, "st')

    status, log = run_job(tmp_path, *TRAINING, env=env, log="log2")
    assert status == 0, log
    assert f"checkpoint {newest} is skipped: {why}" in log, log
    assert f": moved to {folder / 'set-aside' / newest.name}" in log, log
    assert "has a torn line at line" in log and "dropped '{\"update\": 100000" in log, log
    resumed_from = int(older.name[11:20])
    assert f"resuming from update {resumed_from}" in log, log
    assert (folder / "set-aside" / newest.name).exists()
    records = trace(tmp_path / "trace")
    check_history(records, 40)  # truncated at the older checkpoint, the fragment gone, then continued
    check_final_weights(tmp_path, records, synthetic.parse_args(list(map(str, TRAINING))))


@pytest.mark.mpi
@pytest.mark.slow
def test_several_servers_resume_from_the_newest_cut_of_one_run_at_the_same_pushes(tmp_path):
    """Server 1's newest cut belongs to another run (as when a resumed job,
    killed again mid-cut, left one server with a file of the earlier run
    under the same number), and server 0 alone holds a newer cut: the
    servers compare run ids and push counts before anything loads, skip
    both, set the files aside, and resume together from the cut before."""

    servers = 2
    folder = tmp_path / "checkpoints"
    env = {"HVD_DCASGD_CHECKPOINT_DIR": str(folder), "HVD_DCASGD_TRACE": str(tmp_path / "trace"),
           "HVD_DCASGD_SERVERS": str(servers)}
    _checkpointed_run(tmp_path, env, servers)
    mine = [folder / f"server-{s}-of-{servers}" for s in range(servers)]
    cuts = [[p.name for p in _numbered(f)] for f in mine]
    assert cuts[0] == cuts[1] and len(cuts[0]) == 2, cuts
    older, newest = cuts[0]
    other = torch.load(mine[1] / newest, weights_only=True)
    other["run"] = "a-run-before"
    other["checksum"] = checksum(other)  # whole, of another run
    torch.save(other, mine[1] / newest)
    number = int(newest[11:20])
    ahead = f"checkpoint-{number + 1:09d}.pt"
    shutil.copy(mine[0] / newest, mine[0] / ahead)  # server 0 wrote one more cut, server 1 did not

    status, log = run_job(tmp_path, *TRAINING, env=env, log="log2", servers=servers)
    assert status == 0, log
    assert f"the servers' checkpoints of cut {number} in {folder} are not of one cut" in log, log
    assert log.count("resuming from update") == servers, log
    assert sorted(p.name for p in (mine[0] / "set-aside").iterdir()) == [newest, ahead]
    assert [p.name for p in (mine[1] / "set-aside").iterdir()] == [newest]
    check_resumed_sharded(tmp_path, trace(tmp_path / "trace"), servers)


def _said(caplog, logger):
    """The messages ``logger`` logged at WARNING."""
    return [r.getMessage() for r in caplog.records if r.name == logger and r.levelname == "WARNING"]


def test_a_torn_line_is_dropped_and_a_whole_record_after_it_kept(tmp_path, caplog):
    path = tmp_path / "trace"
    whole = [{"shard": 0, "offset": 0, "numel": 4}, {"update": 0, "worker": 0, "step": 0, "shard": 0},
             {"update": 0, "worker": 1, "step": 0, "shard": 1}]
    # server 0 was killed in the middle of a line; server 1 appended its whole line after the fragment
    path.write_text(json.dumps(whole[0]) + "\n" + json.dumps(whole[1]) + "\n" + '{"update": 1, "wor'
                    + json.dumps(whole[2]) + "\n" + '{"update": 2, "worker": 0, "st')
    for read in (read_trace, lambda p: truncate_trace(p, {0: 1, 1: 1})):
        caplog.clear()
        records = read(str(path))
        assert records == (whole if read is read_trace else None)  # truncate_trace rewrites the file
        said = _said(caplog, "hvd_dcasgd.telemetry")
        assert any("torn line at line 3" in m and '{"update": 1, "wor' in m for m in said), said
        assert any("torn line at line 4" in m and '{"update": 2, "worker": 0, "st' in m for m in said), said
    assert path.read_text() == "".join(json.dumps(r) + "\n" for r in whole)  # every line whole, ended


# --- the folder at start, the lock -----------------------------------------------

def test_a_folder_locked_by_a_live_job_is_refused_naming_it_and_a_dead_ones_is_taken_over(tmp_path, caplog):
    folder = tmp_path / "checkpoints"
    first = Checkpoints(str(folder), 0)
    with pytest.raises(HvdDcasgdError, match=f"in use by another job \\(process {os.getpid()} on host "
                                             f"{socket.gethostname()}, lock file {folder / LOCK}\\)"):
        Checkpoints(str(folder), 0)
    first.close()
    assert not (folder / LOCK).exists()

    gone = subprocess.Popen(["true"])
    gone.wait()
    for holder in ({"host": socket.gethostname(), "pid": gone.pid},  # its process has ended
                   {"host": socket.gethostname(), "pid": os.getpid(), "started": "0"}):  # its number reused since
        (folder / LOCK).write_text(json.dumps(holder))
        caplog.clear()
        Checkpoints(str(folder), 0).close()
        said = _said(caplog, "hvd_dcasgd.checkpoints")
        assert len(said) == 1 and re.search(f"locked by process {holder['pid']} .* which is gone; this job "
                                            "took it over", said[0]), said
    (folder / LOCK).write_text(json.dumps({"host": "another-node", "pid": 1}))  # cannot be checked from here
    with pytest.raises(HvdDcasgdError, match="process 1 on host another-node"):
        Checkpoints(str(folder), 0)


@pytest.mark.mpi
@pytest.mark.slow
def test_a_second_job_on_a_folder_in_use_is_refused_and_the_first_goes_on(tmp_path):
    folder = tmp_path / "checkpoints"
    env = {"HVD_DCASGD_CHECKPOINT_DIR": str(folder)}
    (tmp_path / "first").mkdir()
    (tmp_path / "second").mkdir()
    first = Job(tmp_path / "first", "--steps", 5000, "--step-time", 0.02, env=env, timeout=240)
    first.wait_for("starts at step 0", WORKERS)
    status, log = run_job(tmp_path / "second", "--steps", 5, env=env, timeout=120)
    assert status != 0, log
    sentence = (f"the checkpoint folder {folder} is in use by another job (process {first.pid(0)} on host "
                f"{socket.gethostname()}, lock file {folder / LOCK})")
    assert log.count(sentence) == 1 and "Traceback" not in log, log  # said once, for every rank
    first.signal_ranks(15)  # the first job was not disturbed: it stops and saves as usual
    assert first.wait() == 75, first.text()
    assert [p.name for p in _numbered(folder)] and not (folder / LOCK).exists()


@pytest.mark.mpi
def test_a_checkpoint_folder_that_is_a_file_is_one_sentence_for_every_rank(tmp_path):
    (tmp_path / "checkpoints").write_text("not a folder")
    status, log = run_job(tmp_path, "--steps", 3, env={"HVD_DCASGD_CHECKPOINT_DIR": str(tmp_path / "checkpoints")},
                          timeout=60)
    assert status != 0, log
    # every rank ends with status 1; the sentence is said once, by the server, without a traceback
    assert log.count(f"cannot use checkpoint folder {tmp_path / 'checkpoints'}: it is a file, not a folder") \
        == 1 and "Traceback" not in log, log


@pytest.fixture
def small_disk(tmp_path):
    """``small_disk(size)``: a folder on a tmpfs of that size (``mount -t tmpfs``), unmounted afterwards."""
    mounted = []

    def mount(size: str) -> Path:
        disk = tmp_path / f"disk{len(mounted)}"
        disk.mkdir()
        result = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(disk)],
                                capture_output=True, text=True)
        if result.returncode != 0:
            unavailable(f"cannot mount a tmpfs to fill up ({result.stderr.strip() or result.returncode}): "
                        "these tests need root and a container allowed to mount")
        mounted.append(disk)
        return disk

    yield mount
    for disk in mounted:
        subprocess.run(["umount", "-l", str(disk)], check=False)


def _fill(disk: Path) -> Path:
    """Write zeros to a file on ``disk`` until no page is left."""
    filler = disk / "filler"
    handle = os.open(filler, os.O_WRONLY | os.O_CREAT)
    try:
        for chunk in (1 << 20, 1 << 16, 1 << 12):
            try:
                while True:
                    os.write(handle, bytes(chunk))
            except OSError:
                pass
    finally:
        os.close(handle)
    return filler


@pytest.mark.mpi
def test_a_folder_without_room_for_one_checkpoint_is_one_sentence_for_every_rank(tmp_path, small_disk):
    disk = small_disk("1m")
    status, log = run_job(tmp_path, "--steps", 3, "--big", 1_000_000, timeout=120,  # a 4 MB buffer
                          env={"HVD_DCASGD_CHECKPOINT_DIR": str(disk / "checkpoints")})
    assert status != 0, log
    assert log.count(f"the checkpoint folder {disk / 'checkpoints'} has 1.0 MB free, and one checkpoint takes at "
                     "least 4.0 MB") == 1 and "Traceback" not in log, log


@pytest.mark.mpi
@pytest.mark.slow
def test_a_failed_checkpoint_write_warns_keeps_the_previous_ones_and_training_goes_on(tmp_path, small_disk):
    folder = small_disk("16m") / "checkpoints"
    env = {"HVD_DCASGD_CHECKPOINT_DIR": str(folder), "HVD_DCASGD_CHECKPOINT_INTERVAL": "0.3",
           "HVD_DCASGD_TRACE": str(tmp_path / "trace")}
    args = ["--steps", 400, "--step-time", 0.02, *TRAINING[4:], "--big", 250_000]  # 1 MB checkpoints
    job = Job(tmp_path, *args, env=env, timeout=300)
    job.wait_for(lambda: len(_numbered(folder)) == 2)
    filler = _fill(folder.parent)
    job.wait_for("could not write checkpoint", 2)  # at two intervals: tried again
    kept = _numbered(folder)
    assert len(kept) == 2
    for path in kept:  # the previous checkpoints stay, whole
        assert Checkpoints.read(path)["format"] == 2
    filler.unlink()  # room again: the next interval writes
    status = job.wait()
    log = job.text()
    assert status == 0, log
    assert f"in {folder} (No space left on device (ENOSPC)); the checkpoints there are kept ({kept[0].name}, " \
           f"{kept[1].name}), training goes on and the next is due in 0.3 s" in log, log
    assert int(_numbered(folder)[-1].name[11:20]) == len(trace(tmp_path / "trace"))  # the final one was written
    assert not list(folder.glob(".checkpoint-*.tmp"))
    records = trace(tmp_path / "trace")
    check_history(records, 400)
    check_final_weights(tmp_path, records, synthetic.parse_args(list(map(str, args))))


# --- non-finite weights --------------------------------------------------------

def test_weights_holding_nan_or_inf_are_never_written_over_good_checkpoints(tmp_path, caplog):
    model = synthetic.Model()
    optimizer = torch.optim.SGD([model.a, model.b], lr=0.1, momentum=0.9)
    layout = ModelLayout.of(optimizer, model.named_parameters(), model)
    server = open_server(load_mpi().COMM_SELF, optimizer, layout, Compensation("adaptive"), num_workers=2,
                         wire_dtype=torch.float32)
    checkpoints = Checkpoints(str(tmp_path / "checkpoints"), 0)
    good = save(server, checkpoints)
    for bad in (float("nan"), float("inf")):
        with torch.no_grad():
            server.weights[3] = bad
        server.updates += 1
        caplog.clear()
        assert save(server, checkpoints) is None
        assert _said(caplog, "hvd_dcasgd.checkpoints") == [
            f"hvd_dcasgd: the server's weights hold NaN or Inf at update {server.updates}: "
            f"checkpoint-{server.updates:09d}.pt not written in {tmp_path / 'checkpoints'}, the checkpoints there "
            f"are kept ({good.name})"]
        assert _numbered(tmp_path / "checkpoints") == [good]
        assert torch.isfinite(Checkpoints.read(good)["weights"]).all()
    with torch.no_grad():
        server.weights[3] = 0.0
    caplog.clear()
    assert save(server, checkpoints).name == f"checkpoint-{server.updates:09d}.pt"
    assert not _said(caplog, "hvd_dcasgd.checkpoints")
    checkpoints.close()


@pytest.mark.mpi
@pytest.mark.slow
def test_a_job_whose_weights_diverge_keeps_its_last_finite_checkpoints(tmp_path):
    """Halfway, one push's finite step overflows the weights to Inf: every
    checkpoint due after that, the final one included, is refused, and the
    two kept are finite."""
    folder = tmp_path / "checkpoints"
    status, log = run_job(tmp_path, *TRAINING, "--bad", "diverge",
                          env={"HVD_DCASGD_CHECKPOINT_DIR": str(folder), "HVD_DCASGD_CHECKPOINT_INTERVAL": "0.1"})
    assert status == 0, log
    assert "the server's weights hold NaN or Inf at update" in log and "not written in" in log, log
    kept = _numbered(folder)
    assert len(kept) == 2, kept
    for path in kept:
        assert torch.isfinite(Checkpoints.read(path)["weights"]).all(), path
    final = int(re.search(r"hvd_dcasgd server: (\d+) updates", log).group(1))
    assert int(kept[-1].name[11:20]) < final, log  # the final one, at the end, was refused
