"""Lifecycle under the real mpirun: sync = sequential SGD, final weights on
every rank, uneven workers, one-process runs, and bad launches failing fast;
in one process, a rank's :class:`Lifecycle` (its phases, the signals and the
end at once that inform it) and the typed stops several servers send each
other (:class:`.cuts.Cuts`)."""

import json
import os
import pickle
import re
import signal
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch

from helpers import PROGRAMS, ROOT, TCP, WORKERS, mpirun, python, run

from hvd_dcasgd.common.errors import HvdDcasgdError
from hvd_dcasgd.common.tags import CUT, STOP
from hvd_dcasgd.runtime.exits import SERVER_SILENT
from hvd_dcasgd.runtime.lifecycle import Lifecycle, Phase, Verdict
from hvd_dcasgd.protocol.stall import StallWatch
from hvd_dcasgd.serving.cuts import Cuts
from hvd_dcasgd.serving.messages import CutOrder

sys.path.insert(0, str(PROGRAMS))
import synthetic  # noqa: E402

STEPS = 8


@pytest.mark.mpi
def test_sync_equals_sequential_sgd_on_concatenated_batches(tmp_path):
    result = mpirun(WORKERS + 1, PROGRAMS / "synthetic.py", "--compensation", "sync", "--steps", STEPS,
                    "--momentum", "0.9", "--out", tmp_path)
    assert result.returncode == 0, result.stdout
    assert f"server: {STEPS} updates in" in result.stdout
    args = synthetic.parse_args(["--momentum", "0.9"])
    torch.manual_seed(1000)
    model = synthetic.Model()
    optimizer = synthetic.make_optimizer(model, args)
    for k in range(STEPS):
        batches = [synthetic.batch(m, k) for m in range(WORKERS)]
        xa, xb, y = (torch.cat(parts) for parts in zip(*batches))
        optimizer.zero_grad()
        synthetic.loss_on(model, xa, xb, y).backward()
        optimizer.step()
    for m in range(WORKERS):
        final = torch.load(tmp_path / f"worker{m}.pt")
        assert torch.allclose(final["a"], model.a.detach(), atol=1e-5)
        assert torch.allclose(final["b"], model.b.detach(), atol=1e-5)


@pytest.mark.mpi
@pytest.mark.parametrize("mode", ["adaptive", "sync"])
def test_uneven_workers_finish_and_every_rank_holds_the_final_weights(tmp_path, mode):
    workers = 3  # sync: rounds of 3, then 2, then 1; with two workers a round of one is a plain update
    result = mpirun(workers + 1, PROGRAMS / "synthetic.py", "--compensation", mode, "--steps", 4, "--uneven",
                    "--out", tmp_path, timeout=120)
    assert result.returncode == 0, result.stdout
    for m in range(workers):
        assert f"worker {m} done: {4 * (m + 1)} steps" in result.stdout
    server = torch.load(tmp_path / "server.pt")
    for m in range(workers):
        final = torch.load(tmp_path / f"worker{m}.pt")
        for name in ("a", "b", "frozen", "running", "batches"):
            assert torch.equal(final[name], server[name]), (m, name)
    # floating-point buffers are averaged over the workers: worker m filled its buffer with m
    assert torch.allclose(server["running"], torch.full((4,), (workers - 1) / 2))
    # integer buffers are summed: worker m counted its 4 * (m + 1) batches
    assert server["batches"].dtype == torch.int64 and server["batches"].item() == 4 * sum(range(1, workers + 1))
    if mode == "sync":  # rounds shrink as workers leave: 4 rounds of every worker, 4 of one fewer, ...
        assert f"server: {4 * workers} updates in" in result.stdout


@pytest.mark.mpi
def test_without_model_buffers_broadcast_by_the_script_are_combined(tmp_path):
    result = mpirun(WORKERS + 1, PROGRAMS / "synthetic.py", "--no-model", "--steps", 3, "--out", tmp_path)
    assert result.returncode == 0, result.stdout
    average = torch.full((4,), (WORKERS - 1) / 2)
    for m in range(WORKERS):
        assert torch.equal(torch.load(tmp_path / f"worker{m}.pt")["running"], average)


@pytest.mark.mpi
def test_stepping_after_shutdown_is_a_clear_error():
    result = mpirun(WORKERS + 1, PROGRAMS / "synthetic.py", "--steps", 2, "--after-shutdown", timeout=60)
    assert result.returncode == 0, result.stdout
    assert result.stdout.count("training has ended (hvd.shutdown() ran)") == WORKERS


def test_one_process_trains_locally_with_a_warning(tmp_path):
    result = python(PROGRAMS / "synthetic.py", "--steps", 3, "--out", tmp_path)
    assert result.returncode == 0, result.stdout
    warnings = [line for line in result.stdout.splitlines() if "Warning" in line]
    assert len(warnings) == 1 and "HvdDcasgdWarning" in warnings[0] and "mpirun -np 5" in warnings[0], result.stdout
    assert "worker 0 done: 3 steps" in result.stdout
    # local training is plain sequential SGD
    args = synthetic.parse_args([])
    torch.manual_seed(1000)
    model = synthetic.Model()
    optimizer = synthetic.make_optimizer(model, args)
    for k in range(3):
        optimizer.zero_grad()
        synthetic.loss_on(model, *synthetic.batch(0, k)).backward()
        optimizer.step()
    assert torch.allclose(torch.load(tmp_path / "worker0.pt")["a"], model.a.detach())


@pytest.mark.mpi
def test_mpirun_np_1_trains_locally_with_a_warning(tmp_path):
    result = mpirun(1, PROGRAMS / "synthetic.py", "--steps", 2)
    assert result.returncode == 0, result.stdout
    assert "trains locally as sequential SGD" in result.stdout


#: One launch, each worker set up unlike the server in its own ways (world rank: [(what, the server's sentence)]):
#: one compensation setting each (the server reports the first of mode, schedule, constants and lr_scaling that
#: differs), and one difference of the model each (the first one found); compression is checked on its own.
MISMATCHES = {
    1: [("mode", "the server runs compensation 'adaptive' but worker 0 asks for 'constant'"),
        ("compression", "worker 0 compresses gradients to float16, the server expects float32")],
    2: [("schedule", "the server runs the 'async' schedule but worker 1 asks for 'sync'"),
        ("shape", "worker 1's model does not match the server's: its parameter 'b' is [17] float32, "
                  "the server's 'b' is [16] float32")],
    3: [("lambda", "worker 2's compensation settings {'mode': 'adaptive', 'lambda_0': 0.5,"),
        ("dtype", "worker 2's model does not match the server's: its parameter 'a' is [48] float64, "
                  "the server's 'a' is [48] float32")],
    4: [("lr_scaling", "the server applies lr_scaling 'none' but worker 3 asks for 'horovod'"),
        ("name", "worker 3's model does not match the server's: its parameter 'z' is [16] float32, "
                 "the server's 'b' is [16] float32")],
    5: [("groups", "worker 4's model does not match the server's: its optimizer's param groups hold [3] "
                   "parameters, the server's hold [1, 1]")],
}


@pytest.mark.mpi
def test_bad_launch_fails_fast_on_every_rank():
    """Every worker set up wrong, each in its own ways: every rank ends, and
    the server says each difference once, naming the worker, without a
    traceback.  (One launch for all nine: each launch pays start-up per rank.)"""
    mismatches = [f"{what}@{rank}" for rank, found in MISMATCHES.items() for what, _ in found]
    result = mpirun(1 + len(MISMATCHES), PROGRAMS / "synthetic.py", *(f"--mismatch={m}" for m in mismatches),
                    timeout=90)
    assert result.returncode != 0
    assert "Traceback" not in result.stdout, result.stdout
    for found in MISMATCHES.values():
        for what, message in found:
            assert result.stdout.count(message) == 1, (what, result.stdout)


@pytest.mark.mpi
def test_nan_gradient_is_refused_and_aborts_the_job():
    result = mpirun(WORKERS + 1, PROGRAMS / "synthetic.py", "--bad", "nan", timeout=60)
    assert result.returncode != 0
    assert "worker 1: the gradient of 'b' holds NaN or Inf at push 3; nothing was pushed" in result.stdout


@pytest.mark.mpi
def test_a_gradient_beyond_the_wire_dtypes_range_is_refused_with_the_dtype_named():
    result = mpirun(WORKERS + 1, PROGRAMS / "synthetic.py", "--bad", "fp16-overflow", "--compression", "fp16",
                    timeout=60)
    assert result.returncode != 0
    assert ("worker 1: the gradient of 'b' holds finite values beyond float16's range (largest 65504) at push 3; "
            "nothing was pushed") in result.stdout, result.stdout[-3000:]


@pytest.mark.mpi
@pytest.mark.parametrize("bad,problem", [
    ("nan-lr", "its learning rate for param group 1 is nan, not a finite number >= 0"),
    ("negative-lr", "its learning rate for param group 1 is -0.1, not a finite number >= 0"),
    ("nan-unchecked", "its gradient holds NaN or Inf (the weights likely diverged: lower the learning rate; lower "
                      "lambda_0 (HVD_DCASGD_LAMBDA, now 8) (docs/USAGE.md, \"Choosing the constants\"))"),
])
def test_the_server_refuses_a_bad_push_whatever_the_workers_check(bad, problem):
    """The sentence names the worker, the push and what is wrong; a non-finite gradient also what to lower."""
    result = mpirun(WORKERS + 1, PROGRAMS / "synthetic.py", "--bad", bad, timeout=60)
    assert result.returncode != 0
    assert (f"hvd_dcasgd: the server refused worker 1 (MPI rank 2), push 3: {problem}; the weights are unchanged"
            in result.stdout), result.stdout[-3000:]


@pytest.mark.mpi
@pytest.mark.parametrize("mode", ["adaptive", "sync"])
def test_no_stall_is_silent(mode):
    """Worker 1 stops for 3.5 s: the server names it; in sync the others
    wait for the server's answer meanwhile, and say so."""
    result = mpirun(4, PROGRAMS / "synthetic.py", "--bad", "stall", "--compensation", mode,  # 3 workers: 2 wait
                    env={"HVD_DCASGD_STALL_WARNING": "1"}, timeout=120)
    assert result.returncode == 0, result.stdout[-3000:]
    named = re.findall(r"\[rank 0\] hvd_dcasgd: worker 1 \(MPI rank 2, host \S+\) has not pushed for (\d+) s",
                       result.stdout)
    assert len(named) >= 2 and int(named[-1]) >= 2, result.stdout[-3000:]  # repeated while the silence lasts
    assert "worker 0 (MPI rank 1" not in result.stdout and "worker 2 (MPI rank 3" not in result.stdout
    waiting = re.findall(r"worker (\d): the server \(MPI rank 0\) has not answered push 3 for", result.stdout)
    assert (sorted(set(waiting)) == ["0", "2"]) == (mode == "sync"), result.stdout[-3000:]


@pytest.mark.mpi
def test_bad_pushes_can_be_skipped_and_counted(tmp_path):
    result = mpirun(WORKERS + 1, PROGRAMS / "synthetic.py", "--bad", "nan-lr", "--steps", STEPS, "--out", tmp_path,
                    env={"HVD_DCASGD_SKIP_BAD_PUSHES": "1"})
    assert result.returncode == 0, result.stdout[-3000:]
    refused = STEPS - 3  # worker 1's rate stays NaN from its push 3 on
    assert f"refused pushes per worker {[0, refused, *[0] * (WORKERS - 2)]}" in result.stdout, result.stdout[-2000:]
    assert f"server: {WORKERS * STEPS - refused} updates in" in result.stdout
    for name in ("server.pt", "worker0.pt", "worker1.pt"):
        weights = torch.load(tmp_path / name)
        assert torch.isfinite(weights["a"]).all() and torch.isfinite(weights["b"]).all(), name


@pytest.mark.mpi
def test_nan_gradient_caught_by_the_script_loses_nothing(tmp_path):
    result = mpirun(WORKERS + 1, PROGRAMS / "synthetic.py", "--bad", "nan-skip", "--steps", STEPS, "--out", tmp_path)
    assert result.returncode == 0, result.stdout
    assert f"server: {WORKERS * STEPS - 1} updates in" in result.stdout
    assert "worker 1 done: 8 steps, 1 skipped" in result.stdout
    assert torch.isfinite(torch.load(tmp_path / "server.pt")["b"]).all()


BLOCK_MPI = "import sys; sys.modules['mpi4py'] = None; import hvd_dcasgd as hvd; hvd.init(); print('size', hvd.size())"


def test_missing_mpi_one_process_warns_and_trains_locally():
    result = run([sys.executable, "-c", BLOCK_MPI])
    assert result.returncode == 0, result.stdout
    assert "MPI is not available" in result.stdout and "size 1" in result.stdout


def test_missing_mpi_under_a_launcher_is_a_clear_error():
    result = run([sys.executable, "-c", BLOCK_MPI], env={"OMPI_COMM_WORLD_SIZE": "3"})
    assert result.returncode != 0
    assert "hvd_dcasgd needs mpi4py, which is not installed" in result.stdout


@pytest.mark.mpi
def test_horovod_helpers_work_among_the_workers(tmp_path):
    workers = 3  # the program broadcasts from worker 2
    result = mpirun(workers + 1, PROGRAMS / "collectives.py", tmp_path, timeout=60)
    assert result.returncode == 0, result.stdout
    rows = sorted((json.loads(f.read_text()) for f in tmp_path.glob("result*.json")), key=lambda r: r["rank"])
    assert [r["rank"] for r in rows] == list(range(workers)), "only the workers run the loop"
    for r in rows:
        assert r["size"] == workers
        assert r["average"] == pytest.approx((workers - 1) / 2)
        assert r["sum"] == [workers * (workers - 1) // 2, workers]
        assert r["object"] == {"from": 1}
        assert r["gathered"] == list(range(workers))
        assert r["broadcast"] == [20]
        assert r["max"] == workers - 1
        assert r["server_state_entries"] == 2, "momentum buffers of weight and bias, from the server"
        assert r["weight_after_broadcast"] == pytest.approx(7.0 * 6)
        assert r["final_weight"] == pytest.approx(7.0 * 6), "the restore reached the server"
        assert r["final_momentum"] == 0.5 and r["final_state_entries"] == 2
    assert rows[0]["broken_restore"].startswith("hvd_dcasgd: the server could not load_optimizer_state: "
                                                "hvd_dcasgd: the optimizer's state cannot be loaded"), rows[0]
    assert rows[0]["state_after_broken_restore"], "the server's optimizer state is as it was"


@pytest.mark.mpi
@pytest.mark.slow
def test_one_worker_is_sequential_sgd_in_every_mode(tmp_path):
    args = synthetic.parse_args(["--momentum", "0.9"])
    torch.manual_seed(1000)
    model = synthetic.Model()
    optimizer = synthetic.make_optimizer(model, args)
    for k in range(STEPS):
        optimizer.zero_grad()
        synthetic.loss_on(model, *synthetic.batch(0, k)).backward()
        optimizer.step()
    for mode in ("adaptive", "constant", "none", "sync"):
        out = tmp_path / mode
        out.mkdir()
        result = mpirun(2, PROGRAMS / "synthetic.py", "--compensation", mode, "--steps", STEPS,
                        "--momentum", "0.9", "--out", out)
        assert result.returncode == 0, result.stdout
        assert torch.allclose(torch.load(out / "worker0.pt")["a"], model.a.detach(), atol=1e-6), mode


@pytest.mark.mpi
@pytest.mark.slow
def test_mpi_imported_first_works_on_shared_memory_and_explains_itself_over_tcp():
    ok = mpirun(3, PROGRAMS / "import_order.py", "mpi-first", timeout=60)
    assert ok.returncode == 0 and "worker 1 done" in ok.stdout, ok.stdout
    refused = mpirun(3, PROGRAMS / "import_order.py", "mpi-first", mca=TCP, timeout=60)
    assert refused.returncode != 0
    assert refused.stdout.count("MPI runs at thread level MULTIPLE, which Open MPI's one-sided component over TCP "
                                "(osc/pt2pt) refuses: the script imported mpi4py.MPI before hvd_dcasgd") == 1, \
        refused.stdout  # said once, by the server, for every rank


@pytest.mark.mpi
@pytest.mark.parametrize("mca", [(), TCP], ids=["shared-memory", "tcp-pt2pt"])
def test_mpi_imported_after_hvd_dcasgd_works_on_every_path(mca):
    """With Horovod installed the default level is MULTIPLE, which osc/pt2pt
    refuses: importing hvd_dcasgd chose the level before the script loaded MPI."""
    result = mpirun(3, PROGRAMS / "import_order.py", "hvd-first", mca=mca, timeout=60)
    assert result.returncode == 0, result.stdout
    assert "worker 0 done" in result.stdout and "worker 1 done" in result.stdout, result.stdout


def test_a_ranks_lifecycle_moves_forward_only_and_signals_only_inform_it():
    """The phases of one rank: the first signal while training stops it,
    every later one is only counted -- also while ending -- until the grace
    is over; outside a session a signal does what it did before; a stop
    records where, and a move backwards is a sentence."""
    now = [100.0]
    lifecycle = Lifecycle(clock=lambda: now[0])
    assert lifecycle.phase is Phase.STARTING
    assert lifecycle.signal_received(signal.SIGTERM) is Verdict.AS_BEFORE, "before the session"
    lifecycle.start_training(stops_on_signal=True, grace=30.0)
    assert lifecycle.signal_received(signal.SIGUSR1) is Verdict.STOPS and lifecycle.asked_to_stop
    for number in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGTERM):
        assert lifecycle.signal_received(number) is Verdict.NOTED, "a later signal is only counted"
    assert lifecycle.signal == signal.SIGUSR1 and lifecycle.later_signals == 4
    assert lifecycle.phase is Phase.TRAINING, "informed, not moved"
    lifecycle.stop(at=12)
    lifecycle.stop(at=15)
    assert (lifecycle.phase, lifecycle.stopped_at, lifecycle.stopped) == (Phase.STOPPING, 12, True)
    lifecycle.end()
    now[0] += 29.0
    assert lifecycle.signal_received(signal.SIGINT) is Verdict.NOTED, "while ending (shutdown, the last checkpoint)"
    now[0] += 1.0
    assert lifecycle.signal_received(signal.SIGINT) is Verdict.NOW, "the grace is over: the way out at once"
    assert Lifecycle().signal_received(signal.SIGTERM) is Verdict.AS_BEFORE
    with pytest.raises(HvdDcasgdError, match="cannot go from ending to training"):
        lifecycle.move(Phase.TRAINING)
    lifecycle.finish()
    assert lifecycle.phase is Phase.FINISHED
    assert lifecycle.signal_received(signal.SIGTERM) is Verdict.AS_BEFORE, "this rank's part is over"


def test_without_a_grace_every_later_signal_is_only_counted():
    now = [0.0]
    lifecycle = Lifecycle(clock=lambda: now[0])
    lifecycle.start_training(stops_on_signal=True, grace=None)
    assert lifecycle.signal_received(signal.SIGINT) is Verdict.STOPS
    now[0] += 1e6
    assert lifecycle.signal_received(signal.SIGINT) is Verdict.NOTED


def test_horovods_baseline_leaves_signals_as_they_were():
    lifecycle = Lifecycle()
    lifecycle.start_training(stops_on_signal=False)
    assert lifecycle.signal_received(signal.SIGTERM) is Verdict.AS_BEFORE and not lifecycle.asked_to_stop


def test_silence_is_measured_while_the_watcher_runs_not_by_the_clock():
    """A gap between two looks longer than FROZEN_AFTER (the watcher was
    frozen: a suspended job) is nobody's silence; silence while it looks is."""
    now = [0.0]
    watch = StallWatch(["worker 0"], None, clock=lambda: now[0])
    now[0] += 6.0  # the whole job was suspended: no look for 6 s
    assert watch.silent_past([True], 3.0) == []
    for _ in range(40):  # then the watcher looks every 0.1 s and the worker stays silent
        now[0] += 0.1
        silent = watch.silent_past([True], 3.0)
    assert silent == [0]


def test_a_signal_past_the_grace_ends_the_process_at_once_with_a_sentence():
    """The way out at once: the handler says so, then the signal's own
    default action ends the process (status -SIGTERM); a noted one does not."""
    program = ("import os, signal, time\n"
               "from hvd_dcasgd.runtime import preemption\n"
               "from hvd_dcasgd.runtime.lifecycle import Lifecycle\n"
               "lifecycle = Lifecycle()\n"
               "lifecycle.start_training(stops_on_signal=True, grace=0.5)\n"
               "preemption.install(lifecycle.signal_received, 'rank 3 (worker 2)')\n"
               "os.kill(os.getpid(), signal.SIGTERM)\n"
               "os.kill(os.getpid(), signal.SIGINT)\n"
               "print('noted', lifecycle.signal, lifecycle.later_signals, flush=True)\n"
               "time.sleep(0.6)\n"
               "os.kill(os.getpid(), signal.SIGINT)\n"
               "time.sleep(5)\n"
               "print('not reached', flush=True)\n")
    result = run([sys.executable, "-c", program], timeout=60)
    assert result.returncode == -signal.SIGINT, result.stdout
    assert f"noted {int(signal.SIGTERM)} 1" in result.stdout and "not reached" not in result.stdout, result.stdout
    assert ("hvd_dcasgd: rank 3 (worker 2) ends at once on SIGINT, which came HVD_DCASGD_STOP_GRACE seconds or more "
            "after the first stop signal") in result.stdout, result.stdout


def test_the_end_at_once_says_its_sentence_and_ends_the_process_with_its_status():
    """A watchdog thread informs the lifecycle while the main thread is
    stuck (here in a wait that never ends, in a job inside MPI): the
    lifecycle says the sentence on standard error and ends the process
    with the status it was given, without running anything more."""
    sentence = ("hvd_dcasgd: worker 2: the server (MPI rank 0) has not answered for 7 s "
                "(HVD_DCASGD_STALL_TIMEOUT=5); ending the job.")
    program = ("import atexit, threading\n"
               "from hvd_dcasgd.runtime.lifecycle import Lifecycle\n"
               "atexit.register(print, 'atexit ran', flush=True)\n"
               "lifecycle = Lifecycle()\n"
               f"threading.Thread(target=lifecycle.end_now, args=({sentence!r}, {SERVER_SILENT}), daemon=True).start()\n"
               "threading.Event().wait(60)\n"
               "print('not reached', flush=True)\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    result = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=60, env=env,
                            cwd=ROOT)
    assert result.returncode == SERVER_SILENT, (result.stdout, result.stderr)
    assert sentence in result.stderr, result.stderr
    assert "not reached" not in result.stdout and "atexit ran" not in result.stdout, result.stdout


class _Status:
    source = None

    def Get_source(self):
        return self.source


class _Servers:
    """Several servers' communicator in one process: what a server sends
    waits, pickled as mpi4py's ``send`` pickles it, until the one it is for
    probes and receives it."""

    ANY_SOURCE = -1

    def __init__(self, size):
        self.size, self.queued = size, []  # (source, dest, tag, pickled)
        self.mpi = SimpleNamespace(ANY_SOURCE=self.ANY_SOURCE, Status=_Status)

    def at(self, rank):
        servers = self

        class End:
            def Get_rank(self):
                return rank

            def Get_size(self):
                return servers.size

            def send(self, message, dest, tag):
                servers.queued.append((rank, dest, tag, pickle.dumps(message)))

            def _first(self, source, tag):
                return next((q for q in servers.queued if q[1] == rank and q[2] == tag
                             and source in (q[0], servers.ANY_SOURCE)), None)

            def Iprobe(self, source, tag, status=None):
                found = self._first(source, tag)
                if found is not None and status is not None:
                    status.source = found[0]
                return found is not None

            def recv(self, source, tag):
                found = self._first(source, tag)
                servers.queued.remove(found)
                return pickle.loads(found[3])

        return End()


def test_servers_send_each_other_typed_orders_and_requests():
    """The first server's orders (a cut, a drop, the end) and another's
    request to stop travel as typed messages and come back as such."""
    servers = _Servers(3)
    first, second, third = (Cuts(servers.mpi, servers.at(s)) for s in range(3))
    assert first.order(stop=False) == CutOrder(1, False) and first.number == 1
    assert second.ordered() == CutOrder(1, False) and second.number == 1
    assert second.ordered() is None and not second.ended
    first.drop(2)
    first.drop(0)
    assert third.dropped() == [2, 0] and third.dropped() == []
    third.want_stop()
    third.want_stop()  # asked once
    assert first.stop_wanted() and not first.stop_wanted()
    assert first.order(stop=True) == CutOrder(2, True)
    first.end()
    assert third.ordered() == CutOrder(1, False) and third.ordered() == CutOrder(2, True)
    assert third.ordered() is None and third.ended
    assert second.ordered() == CutOrder(2, True) and second.ordered() is None and second.ended
    assert second.dropped() == [2, 0]
    assert servers.queued == []


@pytest.mark.parametrize("source, dest, tag, message, sentence", [
    (0, 1, CUT, (1, False), "rank 1 (server 1) received (1, False) (tuple) from rank 0 (server 0) where a CutOrder "
                            "was expected"),
    (2, 0, STOP, True, "rank 0 (server 0) received True (bool) from rank 2 (server 2) where a StopRequest was "
                       "expected"),
])
def test_a_message_of_another_type_between_servers_is_an_internal_error_naming_the_ranks(source, dest, tag, message,
                                                                                        sentence):
    servers = _Servers(3)
    servers.at(source).send(message, dest=dest, tag=tag)
    receiver = Cuts(servers.mpi, servers.at(dest))
    with pytest.raises(HvdDcasgdError, match=re.escape(f"hvd_dcasgd: internal error: {sentence}")):
        receiver.stop_wanted() if dest == 0 else receiver.ordered()


def test_every_rank_is_training_before_any_rank_leaves_the_start():
    """``transitions.start`` on a real single-rank communicator, with a side that records its calls and a real
    lifecycle: the lifecycle is still starting while the side opens and resumes, and is training (stops on a
    signal, with its grace) when the barrier is entered, before the start's last exchange (the broadcast of the
    weights).  So once any rank has started, every rank takes a stop signal gracefully: a server signalled between
    its start and its serving loop once ended as before the session (status 143, no checkpoint)."""
    from hvd_dcasgd.runtime.lifecycle import Lifecycle, Phase
    from hvd_dcasgd.runtime.mpi import load_mpi
    from hvd_dcasgd.runtime.preemption import stop_grace_seconds
    from hvd_dcasgd.serving.messages import Resumed
    from hvd_dcasgd.serving.transitions import start

    calls = []
    lifecycle = Lifecycle()

    def record(name):
        calls.append((name, lifecycle.phase, lifecycle.stops_on_signal))

    class Recorded:  # the communicator itself, with its collectives recorded
        def __init__(self, comm):
            self.comm = comm

        def __getattr__(self, name):
            attribute = getattr(self.comm, name)
            if name not in ("Barrier", "bcast", "Bcast", "Ibcast"):
                return attribute
            return lambda *args, **kwargs: record(name) or attribute(*args, **kwargs)

    class Side:
        def find_checkpoint(self):
            record("find_checkpoint")

        def open_windows(self, shard, comm):
            record("open_windows")

        def resume(self):
            record("resume")
            return Resumed()

        def start_tensors(self, shard):
            record("start_tensors")
            return [torch.arange(3.0)]

    comms = [load_mpi().COMM_SELF.Dup() for _ in range(2)]  # a worker of two servers: a barrier with each
    try:
        assert start([Recorded(comm) for comm in comms], Side(), lifecycle) == Resumed()
    finally:
        for comm in comms:
            comm.Free()
    names = [name for name, _, _ in calls]
    assert names.count("Barrier") == 2 and lifecycle.grace == stop_grace_seconds(), calls
    barrier = names.index("Barrier")
    assert all(phase is Phase.STARTING for _, phase, _ in calls[:barrier]), calls
    assert {"find_checkpoint", "open_windows", "resume"} <= set(names[:barrier]), calls
    assert all(phase is Phase.TRAINING and stops for _, phase, stops in calls[barrier:]), calls
    assert any(c in ("bcast", "Bcast", "Ibcast") for c in names[barrier + 1:]), calls  # the last exchange
