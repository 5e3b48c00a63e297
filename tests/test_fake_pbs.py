"""The fake PBS command set (tests/fake_pbs) answers in formats the PBS parsers accept, for
both families, and moves jobs along as a server would. It is what the PBS backend's
end-to-end tests run against; here it is driven through the same argv builders and parsers
the backend uses."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from proxy_agent.schedulers.batch.pbs import parse as P
from proxy_agent.schedulers.batch.pbs.system import PbsSystem
from proxy_agent.service.jobs import JobSpec, JobState
from wait_support import scaled, wait_until_blocking

FAKE_BIN = Path(__file__).parent / "fake_pbs" / "bin"


class Cluster:
    """One fake server: runs PBS commands with PATH pointing at the fake set."""

    def __init__(self, family: str, root: Path, **settings: str) -> None:
        self.family = family
        self.system = PbsSystem(family)
        self.root = root
        self.env = dict(
            os.environ,
            PATH=f"{FAKE_BIN}:{os.environ.get('PATH', '/usr/bin:/bin')}",
            FAKE_PBS_FAMILY=family,
            FAKE_PBS_STATE=str(root / "state"),
            FAKE_PBS_QUEUE_SECONDS="0.2",
            HOME=str(root),
            **settings,
        )

    def run(self, argv, stdin: str = "", check: bool = True) -> subprocess.CompletedProcess:
        result = subprocess.run(list(argv), input=stdin, capture_output=True, text=True, env=self.env,
                                cwd=str(self.root), timeout=scaled(30))
        if check:
            assert result.returncode == 0, (argv, result.stderr)
        return result

    def submit(self, spec: JobSpec) -> str:
        submission = self.system.submission(spec)
        return self.system.parse_submit(self.run(submission.argv, submission.script).stdout)

    def jobs(self):
        return {job.job_id: job for job in self.system.parse_status(self.run(self.system.status_argv()).stdout)}

    def wait(self, job_id: str, condition, timeout: float = scaled(30)):
        def reached():
            job = self.jobs().get(job_id)
            return (job,) if condition(job) else None

        return wait_until_blocking(reached, timeout, interval=0.1, what=f"{job_id} to change")[0]

    def final(self, job_id: str):
        """The final record as the backend finds it once the job left the listing."""
        job = self.jobs().get(job_id)
        if job is not None:
            return job
        result = self.run(self.system.final_argv(job_id), check=False)
        if result.returncode == 0:
            return self.system.parse_final(result.stdout, job_id)
        assert P.is_unknown_job_error(result.stderr), result.stderr
        return self.system.parse_tracejob(self.run(self.system.tracejob_argv(job_id)).stdout, job_id)

    def stop_leftovers(self) -> None:
        # Only the job processes this cluster started and that have not ended (no exit
        # file yet), by their process group ids.
        for pgid_file in (self.root / "state" / "jobs").glob("*.pgid"):
            if pgid_file.with_suffix(".exit").exists():
                continue
            try:
                os.killpg(int(pgid_file.read_text()), signal.SIGKILL)
            except (OSError, ValueError):
                pass


@pytest.fixture(params=["openpbs", "torque"])
def cluster(request, tmp_path):
    c = Cluster(request.param, tmp_path)
    yield c
    c.stop_leftovers()


def program(code: str) -> JobSpec:
    return JobSpec(sys.executable, ["-c", code])


def state_of(cluster: Cluster, job) -> JobState:
    return cluster.system.final_state(job)


def test_probe_output_is_recognised(cluster):
    result = cluster.run(P.VERSION_PROBE_ARGV)
    probe = P.detect_family(result.stdout, result.stderr)
    assert probe.family == cluster.family
    server = cluster.system.parse_server(cluster.run(cluster.system.server_argv()).stdout)
    assert server.default_queue == ("workq" if cluster.family == "openpbs" else "batch")
    assert P.detect_family("", "", cluster.run(P.SERVER_PROBE_ARGV).stdout).family == cluster.family


def test_a_job_queues_runs_and_finishes_with_its_output(cluster, tmp_path):
    out = tmp_path / "result.out"
    go = tmp_path / "go"  # the job runs until the test has seen it running
    program_text = f"import os, sys, time\nwhile not os.path.exists({str(go)!r}): time.sleep(0.05)\nprint('done', sys.argv[1:])"
    spec = JobSpec(sys.executable, ["-c", program_text, "a b", "$(x)"],
                   stdout_path=str(out), stderr_path=str(tmp_path / "result.err"), name="first job", num_procs=2)
    cluster.env["FAKE_PBS_QUEUE_SECONDS"] = "600"  # it waits in the queue while the test looks...
    job_id = cluster.submit(spec)
    queued = cluster.jobs()[job_id]
    assert state_of(cluster, queued) is JobState.QUEUING and queued.hosts == ()
    assert queued.name == "first_job"
    cluster.env["FAKE_PBS_QUEUE_SECONDS"] = "0"  # ...and starts at the next command
    running = cluster.wait(job_id, lambda j: j is not None and j.native_state == "R")
    assert len(running.hosts) == 2 and running.num_procs == 2
    nodes = {n.name: n for n in cluster.system.parse_nodes(cluster.run(cluster.system.nodes_argv()).stdout)}
    assert sum(n.cpus_used for n in nodes.values()) == 2 and all(n.state == "UP" for n in nodes.values())
    queues = cluster.system.parse_queues(cluster.run(cluster.system.queues_argv()).stdout)
    assert sum(q.running for q in queues) == 1
    go.touch()
    cluster.wait(job_id, lambda j: j is None or j.native_state in ("F", "C"))
    final = cluster.final(job_id)
    assert state_of(cluster, final) is JobState.FINISHED and final.exit_code == 0
    assert out.read_text().splitlines() == ["done ['a b', '$(x)']"] * 2


def test_failure_and_deletion_give_their_final_states(cluster):
    failing = cluster.submit(program("raise SystemExit(3)"))
    long = cluster.submit(program("import time; time.sleep(30)"))
    waiting = cluster.submit(JobSpec("/bin/true", hold=True))
    assert state_of(cluster, cluster.jobs()[waiting]) is JobState.HOLD
    cluster.wait(long, lambda j: j.native_state == "R")
    cluster.run(cluster.system.delete_argv(long))
    cluster.run(cluster.system.delete_argv(waiting))
    for job_id in (failing, long, waiting):
        cluster.wait(job_id, lambda j: j is None or j.native_state in ("F", "C"))
    failed, killed, never = (cluster.final(j) for j in (failing, long, waiting))
    assert (state_of(cluster, failed), failed.exit_code) == (JobState.FAILED, 3)
    assert (state_of(cluster, killed), killed.signal) == (JobState.KILLED, "15")
    assert state_of(cluster, never) is JobState.KILLED and never.exit_code is None


def test_hold_release_move_and_their_refusals(cluster):
    other = "long" if cluster.family == "openpbs" else "short"
    job_id = cluster.submit(JobSpec(sys.executable, ["-c", "import time; time.sleep(30)"], hold=True))
    cluster.run(cluster.system.move_argv(job_id, other))
    assert cluster.jobs()[job_id].queue == other
    missing = cluster.run(cluster.system.move_argv(job_id, "nowhere"), check=False)
    assert cluster.system.command_error("move", job_id, missing.stderr).kind.name == "NO_SUCH_QUEUE"
    cluster.run(cluster.system.release_argv(job_id))
    cluster.wait(job_id, lambda j: j.native_state == "R")
    refused = cluster.run(cluster.system.move_argv(job_id, other), check=False)
    assert refused.returncode != 0
    assert "present state" in cluster.system.command_error("move", job_id, refused.stderr).message
    suspend = cluster.run(cluster.system.suspend_argv(job_id), check=False)
    error = cluster.system.command_error("suspend", job_id, suspend.stderr)
    assert "operator or manager" in error.message
    cluster.run(cluster.system.delete_argv(job_id))
    gone = cluster.run(cluster.system.delete_argv("4242." + "fake-head"), check=False)
    assert cluster.system.command_error("delete", "4242.fake-head", gone.stderr).kind.name == "NO_SUCH_JOB"


def test_suspend_and_resume_when_privileged(tmp_path):
    cluster = Cluster("openpbs", tmp_path, FAKE_PBS_PRIVILEGED="1")
    try:
        job_id = cluster.submit(program("import time; time.sleep(30)"))
        cluster.wait(job_id, lambda j: j.native_state == "R")
        cluster.run(cluster.system.suspend_argv(job_id))
        assert state_of(cluster, cluster.jobs()[job_id]) is JobState.SUSPENDED
        cluster.run(cluster.system.resume_argv(job_id))
        assert state_of(cluster, cluster.jobs()[job_id]) is JobState.RUNNING
        cluster.run(cluster.system.delete_argv(job_id))
        cluster.wait(job_id, lambda j: j is None)
    finally:
        cluster.stop_leftovers()


def test_arrays(cluster, tmp_path):
    spec = JobSpec(sys.executable, ["-c", "import os; print(os.environ.get('PBS_ARRAY_INDEX') or os.environ['PBS_ARRAYID'])"],
                   array="1-3", stdout_path=str(tmp_path / "a.out"))
    job_id = cluster.submit(spec)
    assert job_id.endswith("[].fake-head")
    listing = cluster.jobs()
    elements = sorted(j.array_index for j in listing.values() if j.array_id == job_id and j.job_id != job_id)
    assert elements == ["1", "2", "3"]
    assert listing[job_id].array_id == job_id
    done = cluster.wait(job_id, lambda j: j is None or state_of(cluster, j).final)
    final = done if done is not None else cluster.final(job_id)
    assert state_of(cluster, final) is JobState.FINISHED


def test_torque_forgets_completed_jobs_and_tracejob_remembers(tmp_path):
    cluster = Cluster("torque", tmp_path, FAKE_PBS_KEEP_COMPLETED="0")
    try:
        job_id = cluster.submit(program("raise SystemExit(4)"))
        cluster.wait(job_id, lambda j: j is None)
        assert cluster.run(cluster.system.final_argv(job_id), check=False).returncode != 0
        final = cluster.final(job_id)
        assert (final.native_state, final.exit_code, state_of(cluster, final)) == ("C", 4, JobState.FAILED)
    finally:
        cluster.stop_leftovers()


def test_walltime_is_enforced(tmp_path):
    cluster = Cluster("openpbs", tmp_path)
    spec = JobSpec(sys.executable, ["-c", "import time; time.sleep(30)"], wall_time=1)
    job_id = cluster.submit(spec)
    cluster.wait(job_id, lambda j: j is None or j.native_state in ("F", "C"))
    final = cluster.final(job_id)
    assert state_of(cluster, final) is JobState.KILLED and "wall time" in final.reason
    cluster.stop_leftovers()


def test_unknown_options_and_queues_are_refused_like_qsub(cluster):
    bad = cluster.run(["qsub", "-Z", "x"], check=False)
    assert bad.returncode != 0 and "invalid option" in bad.stderr
    spec = JobSpec("/bin/true", queue="nowhere")
    submission = cluster.system.submission(spec)
    refused = cluster.run(submission.argv, submission.script, check=False)
    assert cluster.system.submit_error(refused.stderr).kind.name == "NO_SUCH_QUEUE"
