"""One table of environment variables for the package and the launcher;
a light import; warnings with a category; files written atomically."""

import json
import os
import re
import stat
import sys

import pytest

from helpers import PROGRAMS, ROOT, mpirun, run
from hvd_dcasgd.common.config import VARIABLES, check_environment, setting
from hvd_dcasgd.common.errors import HvdDcasgdValueError
from hvd_dcasgd.common.files import atomic_write
from hvd_dcasgd.observability.telemetry import Telemetry


def test_settings_are_parsed_and_bad_values_named():
    assert setting("HVD_DCASGD_LAMBDA", {"HVD_DCASGD_LAMBDA": "0.5"}) == 0.5
    assert setting("HVD_DCASGD_LAMBDA", {"HVD_DCASGD_LAMBDA": ""}) is None
    assert setting("HVD_DCASGD_HOROVOD", {"HVD_DCASGD_HOROVOD": " Auto "}) == "auto"
    for name, raw, reason in [("HVD_DCASGD_LAMBDA", "fast", "it is not a number"),
                              ("HVD_DCASGD_LAMBDA", "-1", "use a finite number >= 0"),
                              ("HVD_DCASGD_THREAD_LEVEL", "many", "use auto, single, funneled, serialized, multiple")]:
        with pytest.raises(HvdDcasgdValueError, match=f"{name}='{raw}' is not valid: {reason}"):
            setting(name, {name: raw})


def test_the_settings_are_read_once_into_one_frozen_object_with_the_tables_defaults():
    from dataclasses import FrozenInstanceError

    from hvd_dcasgd.common.config import resolve, settings

    environ = {"HVD_DCASGD_STALL_TIMEOUT": "5", "PATH": "/bin"}
    first = settings(environ)
    assert settings(dict(environ)) is first, "the same environment is not read again"
    assert first.stall_timeout == 5.0 and first.progress == 60.0 and first.log_level == "info"
    assert resolve("HVD_DCASGD_PROGRESS", 7.0, environ) == 7.0, "the script's argument over the default"
    assert resolve("HVD_DCASGD_STALL_TIMEOUT", 7.0, environ) == 5.0, "the environment over the argument"
    with pytest.raises(FrozenInstanceError):
        first.environment = {}
    with pytest.raises(TypeError):
        first.environment["HVD_DCASGD_STALL_TIMEOUT"] = 1.0
    with pytest.raises(AttributeError, match="HVD_DCASGD_NO_SUCH is not a variable"):
        first.no_such
    with pytest.raises(HvdDcasgdValueError, match="HVD_DCASGD_PROGRESS='soon' is not valid"):
        settings({"HVD_DCASGD_PROGRESS": "soon"})


@pytest.mark.mpi
@pytest.mark.parametrize("name, raw, sentence", [
    ("HVD_DCASGD_LOG_LEVEL", "loud", "HVD_DCASGD_LOG_LEVEL='loud' is not valid"),  # read at import
    ("HVD_DCASGD_PROGRESS", "soon", "HVD_DCASGD_PROGRESS='soon' is not valid"),  # read at init()
    # a name of the right form that no compensation has: found where DistributedOptimizer is made
    ("HVD_DCASGD_COMPENSATION", "adaptiv", "unknown compensation 'adaptiv'; choose one of"),
])
def test_a_bad_value_in_a_job_is_one_sentence_not_a_traceback_per_rank(name, raw, sentence):
    """Wherever it is found, every rank ends with an error, rank 0 says the
    sentence once, nobody waits."""
    result = mpirun(4, PROGRAMS / "synthetic.py", "--steps", 2, env={name: raw}, timeout=120)
    assert result.returncode != 0, result.stdout
    assert result.stdout.count(sentence) == 1, result.stdout
    assert "Traceback" not in result.stdout, result.stdout


def test_every_variable_the_code_reads_is_in_the_table():
    used = set()
    for folder in ("hvd_dcasgd", "slurm", ".ci", "launch"):
        for path in (ROOT / folder).rglob("*"):
            if path.is_file() and path.suffix in (".py", ".sh", ".sbatch", ""):
                used |= set(re.findall(r"HVD_DCASGD_[A-Z_]*[A-Z]", path.read_text(errors="replace")))
    assert len(used) > 10 and used <= set(VARIABLES), sorted(used - set(VARIABLES))


def test_check_environment_finds_misspellings_and_bad_values():
    problems = check_environment({"HVD_DCASGD_COMPENSATON": "none", "HVD_DCASGD_NATIVE": "yes", "PATH": "/bin",
                                  "HVD_DCASGD_LAMBDA": "0.1", "HVD_DCASGD_SERVER_DEVICE": "cuda 1",
                                  "HVD_DCASGD_COMPENSATION": "dc-asgd"})
    assert len(problems) == 4, problems
    assert any(p.startswith("hvd_dcasgd: HVD_DCASGD_COMPENSATON is not a variable of hvd_dcasgd") for p in problems)
    for sentence in ("HVD_DCASGD_NATIVE='yes' is not valid: use 0, 1.",
                     "HVD_DCASGD_SERVER_DEVICE='cuda 1' is not valid: use a torch device such as cpu, cuda or cuda:1",
                     "HVD_DCASGD_COMPENSATION='dc-asgd' is not valid: use a compensation's name"):
        assert sum(sentence in p for p in problems) == 1, (sentence, problems)
    # the forms every documented value has pass: a registered name of any case, a device with or without an index
    assert check_environment({"HVD_DCASGD_COMPENSATION": "gap_aware", "HVD_DCASGD_SERVER_DEVICE": "cuda:0"}) == []
    assert check_environment({"HVD_DCASGD_COMPENSATION": "MyRule2", "HVD_DCASGD_SERVER_DEVICE": "cpu"}) == []


def test_the_launcher_refuses_a_misspelt_variable():
    result = run([sys.executable, ROOT / "launch" / "hvd-dcasgd-run", "-n", "2", "--dry-run",
                  "examples/train_digits.py"], env={"HVD_DCASGD_LAMDA": "0.1"})
    assert result.returncode == 2
    assert "hvd-dcasgd-run: HVD_DCASGD_LAMDA is not a variable of hvd_dcasgd" in result.stdout


def test_importing_the_package_loads_no_torch_until_asked():
    probe = ("import sys, hvd_dcasgd, hvd_dcasgd.launcher.launch; print('torch' in sys.modules); "
             "hvd_dcasgd.Compensation; print('torch' in sys.modules)")
    assert run([sys.executable, "-c", probe]).stdout.split() == ["False", "True"]


def test_warnings_have_our_category():
    probe = ("import warnings, hvd_dcasgd as hvd; warnings.simplefilter('error', hvd.HvdDcasgdWarning)\n"
             "try:\n    hvd.init()\nexcept hvd.HvdDcasgdWarning as w:\n    print('caught', w)")
    result = run([sys.executable, "-c", probe])
    assert "caught hvd_dcasgd: running as a single process" in result.stdout, result.stdout


def test_atomic_write_gives_the_users_permissions_and_leaves_no_temporary(tmp_path):
    old = os.umask(0o027)
    try:
        atomic_write(tmp_path / "a.json", lambda out: out.write("{}"))
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "a.json").stat().st_mode) == 0o640
    with pytest.raises(ZeroDivisionError):
        atomic_write(tmp_path / "a.json", lambda out: out.write(str(1 / 0)))
    assert (tmp_path / "a.json").read_text() == "{}", "a failed write leaves the old file"
    assert [p.name for p in tmp_path.iterdir()] == ["a.json"]


def test_telemetry_writes_its_summary_as_json(tmp_path):
    telemetry = Telemetry(2)
    for update, (worker, staleness) in enumerate([(0, 0), (1, 1), (0, 1)]):
        telemetry.record(update, worker, staleness)
    telemetry.write_summary(tmp_path / "summary.json")
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["updates"] == 3 and summary["pushes"] == [2, 1]
    assert summary["staleness_histogram"] == {"0": 1, "1": 2} and summary["staleness_max"] == 1
    assert f"{summary['updates_per_s']:.1f} updates/s" in telemetry.summary()


def test_the_tables_lambda_0_default_is_each_rules_own():
    """HVD_DCASGD_LAMBDA's default differs by rule: the table shows each
    rule's, and it must be the one the rule applies."""
    from hvd_dcasgd.algorithm.rules import compensation_rule

    shown = VARIABLES["HVD_DCASGD_LAMBDA"].shown
    for mode in ("constant", "adaptive"):
        assert f"{compensation_rule(mode).defaults['lambda_0']:g} ({mode})" in shown, (mode, shown)
