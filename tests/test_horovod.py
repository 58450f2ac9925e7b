"""Horovod integration: the workers as a Horovod job, the Horovod baseline,
and the drop-in example under ``horovodrun`` and ``mpirun``.

Everything that needs Horovod is skipped, with the reason, where Horovod is
not installed (``bash .ci/setup.sh`` builds it); what must work without it
runs with the integration turned off (``HVD_DCASGD_HOROVOD=0``).
"""

import ast
import difflib
import json
import os
import re
import shutil
import sys

import pytest

from helpers import PROGRAMS, ROOT, horovod_installed, mpirun, run, unavailable

HOROVOD_INSTALLED = horovod_installed()
needs_horovod = pytest.mark.usefixtures("horovod_required")
AGREEMENT = PROGRAMS / "horovod_agreement.py"
PLAIN = ROOT / "examples" / "pytorch_digits_horovod.py"
OURS = ROOT / "examples" / "pytorch_digits.py"
ELASTIC_PLAIN = ROOT / "examples" / "pytorch_digits_elastic_horovod.py"
ELASTIC = ROOT / "examples" / "pytorch_digits_elastic.py"
WITHOUT_HOROVOD = {"HVD_DCASGD_HOROVOD": "0"}


def horovodrun(np, program, *args, env=None, timeout=240):
    """``horovodrun -np np python program args`` on this host."""
    binary = shutil.which("horovodrun", path=os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"])
    cmd = [binary, "-np", str(np), "-H", f"localhost:{np}", sys.executable, str(program), *map(str, args)]
    return run(cmd, env=env, timeout=timeout)


def launch(launcher: str, np: int, program, *args):
    """``program`` on ``np`` ranks under ``horovodrun`` or ``mpirun``."""
    return (horovodrun if launcher == "horovodrun" else mpirun)(np, program, *args, timeout=240)


def accuracies(output: str) -> list:
    """Every epoch's test accuracy worker 0 printed, as fractions."""
    found = re.findall(r"Accuracy: ([0-9.]+)%", output)
    assert found, output[-3000:]
    return [float(value) / 100 for value in found]


def final_accuracy(output: str) -> float:
    """The last test accuracy worker 0 printed.  The floors the tests set on
    it are smoke tests: the examples train; numeric references elsewhere
    judge the algorithm."""
    return accuracies(output)[-1]


def agreement(output: str, workers: int):
    """Every worker printed its AGREE record (even where MPI's forwarding ran two lines together)."""
    decoder = json.JSONDecoder()
    ranks = sorted(decoder.raw_decode(part)[0]["rank"] for part in output.split("AGREE ")[1:])
    assert ranks == list(range(workers)), output[-3000:]


@needs_horovod
def test_horovod_was_built_for_pytorch_and_mpi():
    result = run([os.path.join(os.path.dirname(sys.executable), "horovodrun"), "--check-build"], timeout=120)
    assert result.returncode == 0, result.stdout
    assert re.search(r"\[X\] PyTorch", result.stdout), result.stdout
    assert re.search(r"\[X\] MPI", result.stdout), result.stdout


@pytest.mark.mpi
@needs_horovod
@pytest.mark.parametrize("method", ["adaptive", "horovod"])
def test_workers_are_a_horovod_job_and_agree_with_horovod_under_mpirun(method):
    result = mpirun(3, AGREEMENT, method, "compare", env={"HOROVOD_DYNAMIC_PROCESS_SETS": "1"}, timeout=180)
    assert result.returncode == 0, result.stdout[-4000:]
    agreement(result.stdout, 2)


@pytest.mark.mpi
@pytest.mark.slow
@needs_horovod
def test_workers_are_a_horovod_job_under_horovodrun():
    result = horovodrun(3, AGREEMENT, "constant", "compare", env={"HOROVOD_DYNAMIC_PROCESS_SETS": "1"})
    assert result.returncode == 0, result.stdout[-4000:]
    agreement(result.stdout, 2)


@pytest.mark.mpi
def test_collectives_and_join_work_without_horovod():
    result = mpirun(4, AGREEMENT, "none", "alone", env=WITHOUT_HOROVOD, timeout=180)
    assert result.returncode == 0, result.stdout[-4000:]
    agreement(result.stdout, 3)


@pytest.mark.mpi
def test_horovod_baseline_without_horovod_is_a_clear_error_on_every_rank():
    result = mpirun(3, AGREEMENT, "horovod", "alone", env=WITHOUT_HOROVOD, timeout=120)
    assert result.returncode != 0
    assert result.stdout.count('compensation="horovod" on every worker needs Horovod, which is not running: '
                               "HVD_DCASGD_HOROVOD=0 turned it off") == 3, result.stdout[-3000:]


@pytest.mark.mpi
@needs_horovod
def test_workers_that_disagree_about_horovod_all_run_without_it():
    """Horovod turned off on the last worker only: no worker may start it (the
    others would wait in Horovod's start-up forever); each says why."""
    root = ("--allow-run-as-root",) if os.geteuid() == 0 else ()
    program = [sys.executable, str(AGREEMENT), "none", "alone"]
    cmd = ["mpirun", *root, "--oversubscribe", "-np", "3", *program, ":", "-np", "1",
           "env", "HVD_DCASGD_HOROVOD=0", *program]
    result = run(cmd, timeout=180)
    assert result.returncode == 0, result.stdout[-4000:]
    agreement(result.stdout, 3)
    assert result.stdout.count("another worker cannot run Horovod (see its warning); the workers run without "
                               "Horovod") == 2, result.stdout[-3000:]


def test_a_bad_horovod_setting_is_reported_not_taken_for_a_missing_mpi():
    result = run([sys.executable, "-c", "import hvd_dcasgd as hvd; hvd.init()"], env={"HVD_DCASGD_HOROVOD": "yes"})
    assert result.returncode != 0
    assert "HVD_DCASGD_HOROVOD='yes' is not valid: use auto, 0, 1." in result.stdout, result.stdout[-2000:]
    assert "MPI is not available" not in result.stdout


@pytest.mark.parametrize("plain,ours", [(PLAIN, OURS), (ELASTIC_PLAIN, ELASTIC)], ids=["drop-in", "elastic"])
def test_the_drop_in_examples_differ_from_horovods_by_their_import_only(plain, ours):
    plain, ours = plain.read_text().splitlines(), ours.read_text().splitlines()
    changed = [line for line in difflib.unified_diff(plain, ours, lineterm="", n=0) if line[:1] in "+-"]
    assert changed == ["--- ", "+++ ", "-import horovod.torch as hvd", "+import hvd_dcasgd as hvd"], changed


@pytest.mark.mpi
@pytest.mark.slow
def test_horovods_elastic_example_with_only_its_import_changed_trains_asynchronously():
    """Elastic Horovod's form (hvd.elastic.run, TorchState, a commit every batch, reset callbacks) under
    mpirun: each worker runs the training function once, to the end of its epochs, and the test set's
    accuracy is a trained model's."""
    result = mpirun(3, ELASTIC, "--epochs", 6, timeout=240)
    assert result.returncode == 0, result.stdout[-4000:]
    assert "Train Epoch: 6 [0/" in result.stdout and "Train Epoch: 7" not in result.stdout, result.stdout[-3000:]
    assert result.stdout.count("Test set: Average loss") == 1
    assert final_accuracy(result.stdout) > 0.8
    assert "hvd_dcasgd server: " in result.stdout, result.stdout[-2000:]  # the parameter server ran


@pytest.mark.mpi
@pytest.mark.slow
@needs_horovod
def test_plain_horovod_example_trains_under_horovodrun():
    """Under mpirun the same script's run is the reference of
    test_the_unchanged_horovod_script_trains_as_plain_horovod_does_in_every_mode,
    which checks the same floor on it."""
    result = horovodrun(2, PLAIN, "--epochs", 6)
    assert result.returncode == 0, result.stdout[-4000:]
    assert final_accuracy(result.stdout) > 0.8


@pytest.mark.mpi
@pytest.mark.slow
@pytest.mark.parametrize("launcher", ["horovodrun", "mpirun"])
def test_drop_in_example_trains_asynchronously(launcher):
    """Where Horovod is installed, the mpirun case is one of the runs of
    test_the_unchanged_horovod_script_trains_as_plain_horovod_does_in_every_mode
    (the default mode, adaptive, with the same checks and more); it runs here
    where that test cannot, without Horovod."""
    if launcher == "horovodrun" and not HOROVOD_INSTALLED:
        unavailable("Horovod is not installed, so there is no horovodrun: `bash .ci/setup.sh` builds it",
                    deliberate=os.environ.get("HVD_DCASGD_WITHOUT_HOROVOD") == "1")
    if launcher == "mpirun" and HOROVOD_INSTALLED:
        pytest.skip("Horovod is installed: the adaptive run of "
                    "test_the_unchanged_horovod_script_trains_as_plain_horovod_does_in_every_mode checks this")
    result = launch(launcher, 3, OURS, "--epochs", 6)
    assert result.returncode == 0, result.stdout[-4000:]
    assert final_accuracy(result.stdout) > 0.8
    assert "hvd_dcasgd server: " in result.stdout, result.stdout[-2000:]  # the parameter server ran


@pytest.mark.mpi
@pytest.mark.slow
def test_drop_in_example_checkpoints_on_worker_0_and_resumes(tmp_path):
    checkpoints = str(tmp_path / "checkpoint-{epoch}.pth.tar")
    first = mpirun(3, OURS, "--epochs", 2, "--checkpoint-format", checkpoints, timeout=240)
    assert first.returncode == 0, first.stdout[-4000:]
    assert sorted(os.listdir(tmp_path)) == ["checkpoint-1.pth.tar", "checkpoint-2.pth.tar"]

    resumed = mpirun(3, OURS, "--epochs", 3, "--checkpoint-format", checkpoints, timeout=240)
    assert resumed.returncode == 0, resumed.stdout[-4000:]
    assert resumed.stdout.count("Resumed from epoch 2") == 1
    assert "Test set (epoch 3)" in resumed.stdout and "Test set (epoch 2)" not in resumed.stdout
    assert final_accuracy(resumed.stdout) >= final_accuracy(first.stdout) - 0.1  # it went on, not from scratch


@pytest.mark.mpi
@pytest.mark.slow
@needs_horovod
def test_horovod_baseline_runs_the_same_script_with_the_server_idle():
    result = mpirun(3, OURS, "--epochs", 6, env={"HVD_DCASGD_COMPENSATION": "horovod"}, timeout=240)
    assert result.returncode == 0, result.stdout[-4000:]
    assert final_accuracy(result.stdout) > 0.8
    assert "hvd_dcasgd server: " not in result.stdout  # no parameter server ran


@pytest.mark.mpi
@pytest.mark.slow
@needs_horovod
def test_the_unchanged_horovod_script_trains_as_plain_horovod_does_in_every_mode():
    """Horovod's convention -- lr scaled by hvd.size() -- is what the drop-in
    script has; each asynchronous gradient is applied at lr / size().  Applied
    as given, that rate made ASGD end at 33% and DC-ASGD-c at 9% where Horovod
    reached 90%.  Here (4 workers, the example's own 10 epochs, the same run)
    each asynchronous mode's test accuracy, averaged over the last three
    epochs, is within 10 points of plain Horovod's.

    That bound guards against the rate, not the 3-point promise: the
    asynchronous modes are not deterministic, and on digits one epoch's test
    accuracy can move by 12 points, so one run cannot decide a 3-point margin.
    Over 12 runs per mode the last-three-epoch mean ended between 5.5 points
    below plain Horovod's and 0.3 above; the promise, a mean over rounds with
    its interval, is measured by ``benchmarks/drop_in_accuracy.py``
    (docs/USAGE.md).  ``sync`` is Horovod's own algorithm -- the mean of
    size() gradients at lr -- and seeded like it, so every epoch agrees.

    The same runs are the checks that both scripts train under mpirun: plain
    Horovod's and the default mode's (adaptive) final accuracy above 80%, and
    the parameter server ran."""
    plain = mpirun(4, PLAIN, timeout=300)
    assert plain.returncode == 0, plain.stdout[-4000:]
    reference = accuracies(plain.stdout)
    assert reference[-1] > 0.8, "the plain Horovod example trains under mpirun"
    ours = {}
    for mode in ("none", "constant", "adaptive", "sync"):
        result = mpirun(5, OURS, env={"HVD_DCASGD_COMPENSATION": mode}, timeout=300)
        assert result.returncode == 0, result.stdout[-4000:]
        ours[mode] = accuracies(result.stdout)
        if mode == "adaptive":  # the default mode: the drop-in example trains asynchronously under mpirun
            assert ours[mode][-1] > 0.8, result.stdout[-4000:]
            assert "hvd_dcasgd server: " in result.stdout, result.stdout[-2000:]  # the parameter server ran
    print(f"plain Horovod {reference}, hvd_dcasgd {ours}")
    assert all(len(run) == len(reference) == 10 for run in ours.values()), (reference, ours)
    last_three = {mode: sum(run[-3:]) / 3 for mode, run in ours.items()}
    assert all(value >= sum(reference[-3:]) / 3 - 0.10 for value in last_three.values()), (reference, ours)
    assert all(abs(a - b) <= 0.01 for a, b in zip(ours["sync"], reference)), (reference, ours["sync"])


@needs_horovod
def test_every_public_name_of_horovod_torch_exists():
    """Compared with the installed Horovod: each name is there; the ones that
    cannot mean anything here say why when used, never AttributeError."""
    probe = ("import horovod.torch as h, hvd_dcasgd as d\n"
             "names = sorted(n for n in dir(h) if not n.startswith('_'))\n"
             "answers = {}\n"
             "for n in names:\n"
             "    try:\n        getattr(d, n); answers[n] = 'ok'\n"
             "    except d.HvdDcasgdError as e:\n        answers[n] = str(e)\n"
             "print(len(names), answers)")
    result = run([sys.executable, "-c", probe])
    assert result.returncode == 0, result.stdout
    count, answers = result.stdout.split(" ", 1)
    answers = ast.literal_eval(answers)
    assert int(count) == 74 == len(answers)
    refused = {n: a for n, a in answers.items() if a != "ok"}
    assert list(refused) == ["mpi_lib_v2"] and "Horovod's compiled extension" in refused["mpi_lib_v2"]


def test_what_cannot_mean_anything_here_says_why():
    probe = ("import hvd_dcasgd as hvd\nhvd.init()\n"
             "for use in (lambda: hvd.elastic.ElasticSampler, lambda: hvd.start_timeline('t.json')):\n"
             "    try:\n        use()\n    except hvd.HvdDcasgdError as e:\n        print('refused:', e)")
    result = run([sys.executable, "-c", probe], env=WITHOUT_HOROVOD)
    assert "refused: hvd_dcasgd: hvd.elastic.ElasticSampler is not offered: it splits the samples" in result.stdout
    assert "refused: hvd_dcasgd: start_timeline records Horovod's collectives" in result.stdout, result.stdout


@pytest.mark.mpi
def test_sync_batch_norm_normalises_over_every_workers_batch_on_the_cpu(tmp_path):
    result = mpirun(4, PROGRAMS / "sync_batch_norm.py", tmp_path, timeout=120)
    assert result.returncode == 0, result.stdout[-3000:]
    for rank in range(3):
        report = json.loads((tmp_path / f"bn{rank}.json").read_text())
        assert all(value < 1e-5 for key, value in report.items() if key != "rank"), report


@pytest.mark.mpi
@pytest.mark.slow
@needs_horovod
def test_a_horovod_users_habits_give_the_same_outcome(tmp_path):
    """The same lines (tests/programs/habits.py) under plain Horovod and
    under hvd_dcasgd, 2 workers: every outcome alike; one more: the overflowed
    step reached no server (its pushes are the steps GradScaler took)."""
    plain = mpirun(2, PROGRAMS / "habits.py", "horovod.torch", tmp_path, timeout=180)
    assert plain.returncode == 0, plain.stdout[-3000:]
    ours = mpirun(3, PROGRAMS / "habits.py", "hvd_dcasgd", tmp_path, timeout=180)
    assert ours.returncode == 0, ours.stdout[-3000:]
    for rank in range(2):
        theirs = json.loads((tmp_path / f"horovod.torch-{rank}.json").read_text())
        mine = json.loads((tmp_path / f"hvd_dcasgd-{rank}.json").read_text())
        assert mine == theirs, (rank, mine, theirs)
    taken = sum(json.loads((tmp_path / f"hvd_dcasgd-{r}.json").read_text())["steps"] - 1 for r in range(2))
    assert f"pushes per worker [1, 2]" in ours.stdout and f"{taken} updates in" in ours.stdout, ours.stdout[-2000:]
