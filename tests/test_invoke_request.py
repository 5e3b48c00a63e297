"""A JOB_CREATE's attributes -> the job to submit; job states -> the client's statuses."""

from __future__ import annotations

import pytest

from proxy_agent.frontends.invoke.protocol import InvokeStatus
from proxy_agent.frontends.invoke.request import (
    MANDATORY_ATTRIBUTES,
    STATUS_OF_STATE,
    Backend,
    BadJobRequest,
    InvokeDefaults,
    invoke_status,
    job_from_attributes,
)
from proxy_agent.service.jobs import JobState
from wait_support import scaled

BASE = [
    ("hostname", "node1"),
    ("port", "0"),
    ("client_name", "laptop"),
    ("executable_path", "/opt/app/bin/stub"),
    ("backend", "NORMAL"),
    ("count", "1"),
    ("staging", "false"),
    ("argument", "--contextID=1"),
    ("argument", "--jobID=1"),
    ("redirect_enable", "false"),
    ("status_polling", "0"),
    ("refresh_credential", "0"),
]


def no_programs(name):
    return None


def translate(extra=(), *, drop=(), defaults=InvokeDefaults(), find_program=no_programs, base_dir="/home/u"):
    attributes = [(n, v) for n, v in BASE if n not in drop] + list(extra)
    return job_from_attributes("5", attributes, find_program=find_program, base_dir=base_dir, defaults=defaults)


def test_the_minimal_request():
    job = translate()
    spec = job.spec
    assert spec.executable == "/opt/app/bin/stub"
    assert spec.arguments == ("--contextID=1", "--jobID=1")
    assert spec.num_procs == 1
    assert spec.queue is None and spec.candidates == () and spec.broker is None
    assert spec.stdout_path is None and spec.stderr_path is None
    assert spec.wall_time is None
    assert job.backend is Backend.NORMAL and not job.staging
    assert job.hostname == "node1" and job.port == 0 and job.client_name == "laptop"


@pytest.mark.parametrize("name", MANDATORY_ATTRIBUTES)
def test_each_missing_mandatory_attribute_is_named(name):
    with pytest.raises(BadJobRequest) as info:
        translate(drop=(name,))
    assert str(info.value) == f"missing mandatory attribute {name}"


def test_several_missing_attributes_are_all_named():
    with pytest.raises(BadJobRequest, match="missing mandatory attributes port, count"):
        translate(drop=("port", "count"))


def test_the_facts_sheet_mandatory_list_matches_the_protocol_table():
    assert set(MANDATORY_ATTRIBUTES) == {
        "hostname", "port", "client_name", "executable_path", "backend", "count", "staging",
        "argument", "redirect_enable", "status_polling", "refresh_credential",
    }


def test_arguments_keep_order_and_spaces():
    job = translate([("argument", "two words"), ("argument", "")])
    assert job.spec.arguments == ("--contextID=1", "--jobID=1", "two words", "")


def test_count_is_the_number_of_copies_for_normal():
    assert translate([("count", "4")]).spec.num_procs == 4


@pytest.mark.parametrize("value", ["0", "-1", "two", "", "1.5", "70000"])
def test_bad_count_is_named(value):
    with pytest.raises(BadJobRequest, match="attribute count"):
        translate([("count", value)])


@pytest.mark.parametrize("name, value", [("staging", "yes"), ("redirect_enable", "1"), ("port", "70000"), ("port", "x")])
def test_bad_values_are_named(name, value):
    with pytest.raises(BadJobRequest, match=f"attribute {name}"):
        translate([(name, value)])


def test_relative_executable_is_refused():
    with pytest.raises(BadJobRequest, match="absolute path"):
        translate([("executable_path", "bin/stub")])


def test_unknown_backend_is_refused():
    with pytest.raises(BadJobRequest, match="backend must be NORMAL, MPI or BLACS"):
        translate([("backend", "PVM")])


def test_working_directory_and_relative_paths_are_anchored():
    job = translate([("work_directory", "run"), ("redirect_enable", "true"), ("stdout_file", "o.txt"), ("stderr_file", "/tmp/e")])
    assert job.spec.working_dir == "/home/u/run"
    assert job.spec.stdout_path == "/home/u/o.txt"
    assert job.spec.stderr_path == "/tmp/e"


def test_output_files_are_ignored_without_redirect():
    job = translate([("stdout_file", "/tmp/o"), ("stderr_file", "/tmp/e")])
    assert job.spec.stdout_path is None and job.spec.stderr_path is None


def test_environment_lines():
    job = translate([("environment", "A=1"), ("environment", "B"), ("environment", "C=x=y z")])
    assert job.spec.environment == (("A", "1"), ("B", ""), ("C", "x=y z"))


@pytest.mark.parametrize("line", ["=1", "", " A=1"])
def test_bad_environment_lines(line):
    with pytest.raises(BadJobRequest, match="attribute environment"):
        translate([("environment", line)])


def test_time_limits_are_minutes():
    assert translate([("max_wall_time", "10")]).spec.wall_time == 600
    assert translate([("max_time", "3")]).spec.wall_time == 180
    assert translate([("max_time", "3"), ("max_wall_time", "7")]).spec.wall_time == 420
    assert translate([("max_wall_time", "0")]).spec.wall_time is None
    assert translate([("max_cpu_time", "2")]).spec.extra_value("cpu_time") == "120"
    with pytest.raises(BadJobRequest, match="attribute max_wall_time"):
        translate([("max_wall_time", "soon")])


def test_batch_attributes():
    spec = translate([("project", "p42"), ("host_count", "2"), ("max_memory", "512")]).spec
    assert (spec.account, spec.nodes, spec.memory) == ("p42", 2, 512)


def test_queue_name_attribute():
    assert translate([("queue_name", "debug")]).spec.queue == "debug"


def test_options_choose_scheduler_queue_and_broker():
    spec = translate([("scheduler", "slurm"), ("queue", "debug")]).spec
    assert spec.queue == "slurm:debug"
    assert spec.extra_value("scheduler") == "slurm"
    spec = translate([("queue", "a, b,sge:c"), ("broker", "FastestQueue"), ("scheduler", "slurm")]).spec
    assert spec.queue is None
    assert spec.candidates == ("slurm:a", "slurm:b", "sge:c")
    assert spec.broker == "FastestQueue"


def test_scheduler_without_queue_leaves_the_queue_to_the_scheduler():
    spec = translate([("scheduler", "slurm")]).spec
    assert spec.queue is None and spec.candidates == () and spec.extra_value("scheduler") == "slurm"


def test_queue_name_wins_over_the_queue_option():
    assert translate([("queue", "a,b"), ("queue_name", "c")]).spec.queue == "c"


def test_request_options_win_over_defaults_and_defaults_fill_in():
    defaults = InvokeDefaults(scheduler="local", queue="q1,q2", broker="Random")
    spec = translate(defaults=defaults).spec
    assert spec.candidates == ("local:q1", "local:q2") and spec.broker == "Random"
    spec = translate([("queue", "q3"), ("broker", "Fastest")], defaults=defaults).spec
    assert spec.queue == "local:q3" and spec.broker == "Fastest"


@pytest.mark.parametrize("option, value", [("scheduler", "two words"), ("broker", ""), ("queue", "a,,b"), ("queue", " ")])
def test_bad_options_are_named(option, value):
    with pytest.raises(BadJobRequest, match=f"option {option}"):
        translate([(option, value)])


def test_unknown_attributes_are_ignored_and_listed():
    job = translate([("jobmanager", "jobmanager-pbs"), ("future_thing", "1"), ("rsl_extensions", "<x/>")])
    assert job.ignored == ("jobmanager", "future_thing", "rsl_extensions")
    assert job.spec == translate().spec


def test_last_value_wins_for_single_attributes():
    assert translate([("count", "3")]).count == 3


@pytest.mark.parametrize("backend", ["MPI", "BLACS", "mpi"])
def test_mpi_without_mpirun_fails_clearly(backend):
    with pytest.raises(BadJobRequest) as info:
        translate([("backend", backend), ("count", "4")])
    text = str(info.value)
    assert "mpirun" in text and "no mpirun was found on the PATH" in text


def test_mpi_runs_through_mpirun_with_count_processes():
    found = []

    def find(name):
        found.append(name)
        return "/usr/lib/mpi/bin/mpirun"

    job = translate([("backend", "MPI"), ("count", "4")], find_program=find)
    assert found == ["mpirun"]
    spec = job.spec
    assert spec.executable == "/usr/lib/mpi/bin/mpirun"
    assert spec.arguments == ("-np", "4", "/opt/app/bin/stub", "--contextID=1", "--jobID=1")
    assert spec.num_procs == 1
    assert spec.extra_value("mpi_processes") == "4"
    assert job.mpirun == "/usr/lib/mpi/bin/mpirun"


def test_mpirun_option_and_default():
    job = translate([("backend", "MPI"), ("mpirun", "/opt/ompi/bin/mpirun")])
    assert job.spec.executable == "/opt/ompi/bin/mpirun"
    job = translate([("backend", "BLACS")], defaults=InvokeDefaults(mpirun="/x/mpirun"))
    assert job.spec.executable == "/x/mpirun"
    with pytest.raises(BadJobRequest, match="'mpiexec' is not on the PATH"):
        translate([("backend", "MPI"), ("mpirun", "mpiexec")])


def test_normal_backend_never_looks_for_mpirun():
    def find(name):
        raise AssertionError("looked up " + name)

    translate(find_program=find)


def test_staged_program_replaces_the_path():
    job = translate([("staging", "true"), ("tmp_dir", "scratch")])
    assert job.staging and job.tmp_dir == "/home/u/scratch"
    assert job.spec_for("/tmp/s/stub").executable == "/tmp/s/stub"
    assert job.spec_for(job.program) is job.spec
    mpi = translate([("staging", "true"), ("backend", "MPI")], find_program=lambda n: "/bin/mpirun")
    spec = mpi.spec_for("/tmp/s/stub")
    assert spec.executable == "/bin/mpirun"
    assert spec.arguments[:3] == ("-np", "1", "/tmp/s/stub")
    assert spec.extra_value("mpi_program") == "/tmp/s/stub"


def test_status_table_covers_every_state():
    assert set(STATUS_OF_STATE) == set(JobState)
    assert invoke_status(JobState.QUEUING) is InvokeStatus.PENDING
    assert invoke_status(JobState.RUNNING) is InvokeStatus.ACTIVE
    assert invoke_status(JobState.FINISHED) is InvokeStatus.DONE
    assert invoke_status(JobState.KILLED) is InvokeStatus.DONE
    assert invoke_status(JobState.FAILED) is InvokeStatus.FAILED
    assert invoke_status(JobState.OTHER) is None


def test_final_states_map_to_final_statuses_and_back():
    for state, status in STATUS_OF_STATE.items():
        if status is not None:
            assert status.final == state.final, state


def test_protocol_and_request_modules_do_no_io_and_import_no_trio():
    import subprocess
    import sys

    code = (
        "import sys, proxy_agent.frontends.invoke.protocol, proxy_agent.frontends.invoke.request\n"
        "bad = sorted(m for m in ('trio', 'subprocess', 'socket', 'asyncio') if m in sys.modules)\n"
        "print(','.join(bad))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=scaled(30), check=True)
    assert out.stdout.strip() == ""
