"""PBS submissions: qsub argv per family and the job script, with hostile values.

The scripts are run by bash for real (with the fake ``pbsdsh`` of tests/fake_pbs on PATH
when there are several processes); the program prints its argv, environment and directory
as JSON, so every value is checked to arrive verbatim and nothing is executed by a shell.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from proxy_agent.schedulers.batch.pbs.system import PbsSystem
from proxy_agent.schedulers.batch.pbs.directives import (
    NAME_LIMIT,
    PbsUnsupported,
    build_submission,
    check_native_options,
    format_walltime,
    qsub_argv,
    render_pbs_script,
    sanitize_job_name,
)
from proxy_agent.schedulers.batch.script import BatchScriptError
from proxy_agent.service.jobs import ErrorKind, JobSpec, SubmitError
from wait_support import scaled

FAKE_BIN = Path(__file__).parent / "fake_pbs" / "bin"
PRINTER = (
    "import json, os, sys; "
    "names = [n for n in os.environ.get('CHECK_ENV', '').split(',') if n]; "
    "print(json.dumps({'argv': sys.argv[1:], 'cwd': os.getcwd(), "
    "'env': {n: os.environ.get(n) for n in names}, 'task': os.environ.get('PBS_TASKNUM')}))"
)
HOSTILE = [
    "plain", "with space", "single ' quote", 'double " quote', "$(touch pwned-dollar)",
    "`touch pwned-backtick`", "$HOME", "line1\nline2", "\n#PBS -q evil\n", "tab\there", "*", "~",
    "-n", "--", "--help", "", "non-ASCII héllo ✓ 日本語 🚀", "; rm -rf /tmp/x", "| cat /etc/passwd",
    "&& echo hi &", "\\", "a\\\nb", "!!", "#not a comment", "\x01\x1f\x7f control", "<(echo sub)",
    "{a,b}", "%s %d %%", "x" * 3000,
]


def run_script(script: str, tmp_path: Path, env_names=(), procs: int = 1):
    path = tmp_path / "job.sh"
    path.write_text(script, encoding="utf-8")
    node_file = tmp_path / "nodes"
    node_file.write_text("fn01\n" * procs)
    env = {
        "PATH": f"{FAKE_BIN}:{os.environ.get('PATH', '/usr/bin:/bin')}",
        "CHECK_ENV": ",".join(env_names),
        "LC_ALL": "C.UTF-8",
        "HOME": str(tmp_path),
        "PBS_NODEFILE": str(node_file),
    }
    result = subprocess.run(["bash", str(path)], cwd=str(tmp_path), env=env, capture_output=True, timeout=scaled(30))
    assert result.returncode == 0, result.stderr.decode(errors="replace")
    return [json.loads(line) for line in result.stdout.decode("utf-8").splitlines()]


def test_hostile_arguments_arrive_verbatim(tmp_path):
    (out,) = run_script(render_pbs_script(JobSpec(sys.executable, ["-c", PRINTER, *HOSTILE])), tmp_path)
    assert out["argv"] == HOSTILE
    assert not list(tmp_path.glob("pwned*")), "an argument was executed by the shell"


def test_every_copy_gets_the_arguments_environment_and_directory(tmp_path):
    work = tmp_path / "work dir $(touch pwned) 'q' ✓"
    work.mkdir()
    env = {f"V{i}": value for i, value in enumerate(HOSTILE)}
    spec = JobSpec(sys.executable, ["-c", PRINTER, *HOSTILE], environment=env, working_dir=str(work),
                   num_procs=3, prologue=["export FROM_PROLOGUE=\"set by prologue\""])
    script = render_pbs_script(spec)
    assert "exec pbsdsh -- /bin/bash -c " in script
    copies = run_script(script, tmp_path, env_names=[*env, "FROM_PROLOGUE"], procs=3)
    assert sorted(c["task"] for c in copies) == ["1", "2", "3"]
    for copy in copies:
        assert copy["argv"] == HOSTILE
        assert copy["cwd"] == str(work)
        assert copy["env"] == {**env, "FROM_PROLOGUE": "set by prologue"}
    assert not list(tmp_path.glob("pwned*")) and not list(work.glob("pwned*"))


def test_prologue_runs_before_the_program(tmp_path):
    spec = JobSpec(sys.executable, ["-c", PRINTER], prologue=["cd /", "export MARK=$((6*7))"])
    (out,) = run_script(render_pbs_script(spec), tmp_path, env_names=["MARK"])
    assert out["env"] == {"MARK": "42"} and out["cwd"] == "/"


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(args=st.lists(st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"),
                             max_size=30), max_size=5),
       procs=st.integers(1, 2))
def test_any_text_round_trips(tmp_path, args, procs):
    spec = JobSpec(sys.executable, ["-c", PRINTER, *args], num_procs=procs)
    copies = run_script(render_pbs_script(spec), tmp_path, procs=procs)
    assert len(copies) == procs and all(c["argv"] == args for c in copies)


def test_script_has_no_directives_and_bash_accepts_it():
    spec = JobSpec("/bin/true", name="x", environment={"A": "\n#PBS -q evil"}, prologue=["#PBS -l ncpus=99"])
    script = render_pbs_script(spec)
    assert script.startswith("#!/bin/bash\n")
    subprocess.run(["bash", "-n"], input=script.encode(), check=True)
    argv = qsub_argv(spec, "openpbs")
    # qsub would obey "#PBS" lines: scanning is off, whatever the script holds.
    assert argv[argv.index("-C") + 1] == ""


# ------------------------------------------------------------------------------ argv


def test_openpbs_argv_in_full():
    spec = JobSpec(
        "/bin/true", name="relax md", num_procs=8, nodes=2, cpus_per_task=2, memory=4000, gpus=1,
        wall_time=100 * 3600 + 5, queue="workq", account="chem-2024", hold=True,
        stdout_path="/home/u/o.txt", stderr_path="/home/u/e.txt", constraint="ib&avx512",
        exclusive=True, array="1-10:2", begin_time="2024-03-01T18:30", gres="license_x:2",
        native_options=["-m", "abe", "-Wdepend=afterok:12.s", "-lsoftware=gaussian"],
    )
    assert qsub_argv(spec, "openpbs", (23, 6, 6)) == [
        "qsub", "-f", "-C", "", "-S", "/bin/bash", "-N", "relax_md",
        "-o", "/home/u/o.txt", "-e", "/home/u/e.txt", "-k", "oed",
        "-q", "workq", "-h", "-A", "chem-2024",
        "-l", "select=2:ncpus=8:mpiprocs=4:mem=4000mb:ngpus=1:license_x=2:ib=True:avx512=True",
        "-l", "place=scatter:excl",
        "-l", "walltime=100:00:05", "-J", "1-10:2", "-a", "202403011830.00",
        "-m", "abe", "-Wdepend=afterok:12.s", "-lsoftware=gaussian",
    ]


def test_torque_argv_in_full():
    spec = JobSpec(
        "/bin/true", name="2nd-pass", num_procs=8, nodes=2, memory=4000, gpus=2, wall_time=90,
        queue="pbs:batch", stdout_path="out/log.txt", stderr_path="out/log.txt", working_dir="/home/u/w",
        constraint="bigmem", exclusive=True, array="1-5,9%2", native_options=["-K", "60", "-V"],
    )
    assert qsub_argv(spec, "torque", (6, 1, 3)) == [
        "qsub", "-C", "", "-S", "/bin/bash", "-N", "j2nd-pass",
        "-j", "oe", "-o", "/home/u/w/out/log.txt",
        "-q", "batch",
        "-l", "nodes=2:ppn=4:gpus=2:bigmem", "-l", "mem=8000mb", "-n",
        "-l", "walltime=00:01:30", "-t", "1-5,9%2", "-K", "60", "-V",
    ]


def test_process_layouts():
    def select(**kw):
        argv = qsub_argv(JobSpec("/bin/true", **kw), "openpbs")
        return [argv[i + 1] for i, a in enumerate(argv) if a == "-l"]

    assert select() == ["select=1:ncpus=1:mpiprocs=1"]
    assert select(num_procs=6) == ["select=6:ncpus=1:mpiprocs=1"]
    assert select(num_procs=6, cpus_per_task=4, memory=6001) == ["select=6:ncpus=4:mpiprocs=1:mem=1001mb"]
    assert select(num_procs=3, gpus=2) == ["select=1:ncpus=1:mpiprocs=1:ngpus=2+2:ncpus=1:mpiprocs=1"]
    assert select(num_procs=5, nodes=2) == ["select=2:ncpus=3:mpiprocs=3", "place=scatter"]
    assert select(num_procs=1, exclusive=True) == ["select=1:ncpus=1:mpiprocs=1", "place=excl"]

    def nodes(**kw):
        argv = qsub_argv(JobSpec("/bin/true", **kw), "torque")
        return [argv[i + 1] for i, a in enumerate(argv) if a == "-l"]

    assert nodes() == ["nodes=1:ppn=1"]
    assert nodes(num_procs=6, cpus_per_task=2) == ["nodes=1:ppn=12"]
    assert nodes(num_procs=5, nodes=2, gres="matlab:1") == ["nodes=2:ppn=3", "gres=matlab:1"]


def test_version_decides_direct_write():
    spec = JobSpec("/bin/true")
    assert "-k" in qsub_argv(spec, "openpbs", (19, 1, 3))
    assert "-k" in qsub_argv(spec, "openpbs", ())
    assert "-k" not in qsub_argv(spec, "openpbs", (18, 1, 4))
    assert "-k" not in qsub_argv(spec, "torque", (6, 1, 3))
    assert "-f" not in qsub_argv(spec, "torque")  # Torque's -f means fault tolerant


def test_output_paths():
    with_colon = JobSpec("/bin/true", stdout_path="/data/run:1/out")
    with pytest.raises(BatchScriptError, match="host:path"):
        qsub_argv(with_colon, "openpbs")
    argv = qsub_argv(with_colon, "openpbs", submit_host="login1.example.org")
    assert argv[argv.index("-o") + 1] == "login1.example.org:/data/run:1/out"
    with pytest.raises(BatchScriptError, match="relative"):
        qsub_argv(JobSpec("/bin/true", stdout_path="out.txt"), "torque")
    argv = qsub_argv(JobSpec("/bin/true", stdout_path="../o", working_dir="/w/x"), "torque")
    assert argv[argv.index("-o") + 1] == "/w/x/../o"


@pytest.mark.parametrize(
    "name, openpbs, torque",
    [
        ("relax", "relax", "relax"),
        ("9lives", "j9lives", "j9lives"),
        ("1e5", "j1e5", "j1e5"),
        ("", "j", "j"),
        ("分子 動力学", "j______", "j______"),
        ("a$(x)`y` b;c", "a__x__y__b_c", "a__x__y__b_c"),
        ("-N", "j-N", "j-N"),
        ("n" * 300, "n" * 236, "n" * 15),
    ],
)
def test_job_names_are_sanitised(name, openpbs, torque):
    assert sanitize_job_name(name, "openpbs") == openpbs
    assert sanitize_job_name(name, "torque") == torque
    for family in ("openpbs", "torque"):
        cleaned = sanitize_job_name(name, family)
        assert cleaned[0].isalpha() and len(cleaned) <= NAME_LIMIT[family]
        assert all(ch.isascii() and (ch.isalnum() or ch in "_.+-") for ch in cleaned)


def test_default_name_is_the_program():
    argv = qsub_argv(JobSpec("/opt/app/bin/solver.x"), "openpbs")
    assert argv[argv.index("-N") + 1] == "solver.x"
    submission = build_submission(JobSpec("/bin/true", name="two words"), "torque")
    assert submission.pbs_name == "two_words" and submission.argv[0] == "qsub"


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("queue", "a b", "white space"),
        ("queue", "-q", "must not start"),
        ("queue", "x\ny", "must not contain"),
        ("account", "", "empty"),
        ("account", "--help", "must not start"),
        ("stdout_path", "/tmp/a\nb", "must not contain"),
        ("working_dir", "/tmp/\0", "must not contain"),
        ("constraint", "a|b", "choose between"),
        ("constraint", "a b", "not a valid name"),
        ("constraint", "&", "empty"),
        ("gres", "gpu:x", "NAME or NAME:COUNT"),
        ("array", "1,2,3", "one range"),
        ("array", "1-10%2", "one range"),
        ("array", "5-1", "one range"),
        ("begin_time", "tomorrow", "date and time"),
        ("begin_time", "2024-03-01T18:30\n", "must not contain"),
        ("num_procs", 0, "at least 1"),
        ("cpus_per_task", 0, "at least 1"),
        ("nodes", 0, "at least 1"),
        ("memory", 0, "at least 1"),
        ("wall_time", 0, "at least 1"),
        ("environment", {"1BAD": "x"}, "not a shell identifier"),
        ("environment", {"A B": "x"}, "not a shell identifier"),
        ("arguments", ["a\0b"], "NUL"),
        ("executable", "", "executable is empty"),
        ("prologue", ["module load x\nrm -rf ~"], "must not contain"),
    ],
)
def test_bad_values_are_refused_naming_the_field(field, value, message):
    spec = JobSpec(**{"executable": "/bin/true", field: value})
    with pytest.raises(BatchScriptError, match=message):
        qsub_argv(spec, "openpbs")


def test_more_nodes_than_processes_is_refused():
    with pytest.raises(BatchScriptError, match="smaller than nodes"):
        qsub_argv(JobSpec("/bin/true", num_procs=2, nodes=4), "torque")


def test_torque_array_forms():
    assert qsub_argv(JobSpec("/bin/true", array="0-99%5"), "torque")[-2:] == ["-t", "0-99%5"]
    with pytest.raises(BatchScriptError, match="Torque takes"):
        qsub_argv(JobSpec("/bin/true", array="1-10:2"), "torque")


def test_qos_is_not_supported():
    with pytest.raises(PbsUnsupported, match="quality of service"):
        qsub_argv(JobSpec("/bin/true", qos="high"), "openpbs")
    with pytest.raises(SubmitError) as caught:
        PbsSystem("torque").submission(JobSpec("/bin/true", qos="high"))
    assert caught.value.kind is ErrorKind.NOT_SUPPORTED
    with pytest.raises(SubmitError) as caught:
        PbsSystem("openpbs").submission(JobSpec("/bin/true", queue="a b"))
    assert caught.value.kind is ErrorKind.BAD_REQUEST and "queue" in caught.value.message


# ------------------------------------------------------------------------------ native options


@pytest.mark.parametrize(
    "family, options",
    [
        ("openpbs", ["-l", "software=ansys"]),
        ("openpbs", ["-lsoftware=ansys", "-W", "depend=afterok:1.s", "-mbe", "-M", "me@x"]),
        ("openpbs", ["-V", "-r", "n", "-P", "project-x", "-v", "A=1,B=2"]),
        ("openpbs", ["-W", "group_list=staff"]),
        ("torque", ["-l", "pmem=2gb", "-D", "/root", "-T", "prologue.sh", "-F", "a b"]),
        ("torque", ["-K", "30", "-L", "tasks=2:lprocs=4", "-i", "5", "-b", "10"]),
    ],
)
def test_native_options_accepted(family, options):
    assert check_native_options(options, family) == options


@pytest.mark.parametrize(
    "family, options, message",
    [
        ("openpbs", ["script.sh"], "does not start with '-'"),
        ("openpbs", ["--", "/bin/sh"], "not a qsub option"),
        ("openpbs", ["--version"], "not a qsub option"),
        ("openpbs", ["-"], "not a qsub option"),
        ("openpbs", ["-Z"], "-Z is not a qsub option of openpbs"),
        ("openpbs", ["-t", "1-3"], "-t is not a qsub option of openpbs"),
        ("torque", ["-J", "1-3"], "-J is not a qsub option of torque"),
        ("openpbs", ["-I"], "interactive"),
        ("torque", ["-x"], "interactive"),
        ("openpbs", ["-X"], "X11"),
        ("openpbs", ["-z"], "job's id"),
        ("openpbs", ["-Vz"], "job's id"),
        ("openpbs", ["-W", "block=true"], "wait"),
        ("openpbs", ["-Wdepend=afterok:1,block=true"], "wait"),
        ("openpbs", ["-N", "x"], "name"),
        ("openpbs", ["-o", "/tmp/x"], "stdout_path"),
        ("openpbs", ["-koe"], "output paths"),
        ("openpbs", ["-q", "long"], "queue"),
        ("openpbs", ["-J", "1-4"], "array"),
        ("torque", ["-d", "/tmp"], "working_dir"),
        ("torque", ["-n"], "exclusive"),
        ("openpbs", ["-C", "#X"], "directive scanning"),
        ("openpbs", ["-S", "/bin/sh"], "bash"),
        ("openpbs", ["-l"], "needs a value"),
        ("openpbs", ["-l", "a=1\nb"], "must not contain"),
    ],
)
def test_native_options_refused(family, options, message):
    with pytest.raises(BatchScriptError, match=message):
        check_native_options(options, family)


def test_walltime_format():
    assert format_walltime(0) == "00:00:00"
    assert format_walltime(3599) == "00:59:59"
    assert format_walltime(360000) == "100:00:00"


_TEXT = st.text(max_size=20)


@settings(max_examples=300, deadline=None)
@given(
    family=st.sampled_from(["openpbs", "torque"]),
    fields=st.fixed_dictionaries({}, optional={
        "name": _TEXT, "queue": _TEXT, "account": _TEXT, "constraint": _TEXT, "gres": _TEXT,
        "array": _TEXT, "begin_time": _TEXT, "stdout_path": _TEXT, "stderr_path": _TEXT,
        "working_dir": _TEXT, "qos": _TEXT,
        "native_options": st.lists(_TEXT, max_size=4), "prologue": st.lists(_TEXT, max_size=2),
        "num_procs": st.integers(-2, 64), "nodes": st.integers(-1, 8), "memory": st.integers(-1, 10 ** 7),
        "gpus": st.integers(-1, 8), "wall_time": st.integers(-1, 10 ** 7), "cpus_per_task": st.integers(-1, 8),
    }),
)
def test_any_job_description_gives_argv_or_a_clear_refusal(family, fields):
    try:
        argv = qsub_argv(JobSpec(executable="/bin/true", **fields), family, submit_host="login1")
    except BatchScriptError as error:
        assert str(error)
        return
    assert argv[0] == "qsub" and all(isinstance(a, str) and "\0" not in a for a in argv)
    name = argv[argv.index("-N") + 1]
    assert name[:1].isalpha() and name.isascii()
