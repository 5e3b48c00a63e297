"""Records real Grid Engine output for the parser tests.

    scripts/sge-up && .venv/bin/python tests/data/sge/capture.py [PHASE...]

Phases: transfer, finished, listing, commands, host-down (default: all, in that order).

Needs the cell of scripts/sge-up (queues all.q with 4 slots and short.q with 2, PE smp,
resources gpu/exclusive/ssd, the local user sgeuser) with no other jobs, and root: it
stops the execution daemon for a few seconds (SIGSTOP/SIGCONT, to catch jobs in transfer
and in deletion), suspends and disables short.q for a moment, and at the end shuts the
execution daemon down and starts it again (to record a host that is down).

Every job is submitted through ``sge_script.submit_argv`` / ``render_script`` (the script on
stdin) unless a role needs something the builders refuse.  Each query is saved under the
name of the builder that made it into ``tests/data/sge/<version>/``; ``roles.json`` maps
each job's role to its id and the state it was meant to be in, plus the capture's time zone.
It takes about three minutes (a rescheduled job waits for its host to report the first
run cleaned up) and deletes every job it submitted.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.abspath(os.path.join(HERE, "..", "..", "..")))

from proxy_agent.schedulers.batch.sge import directives as sge_script, parse as sge_parse, system as sge  # noqa: E402
from proxy_agent.service.jobs import JobSpec  # noqa: E402

WORK = "/tmp/proxy-agent-sge-capture"
os.makedirs(WORK, exist_ok=True)
EXECD_PID = "/var/run/gridengine/execd.pid"
OTHER_USER = "sgeuser"
ODD_NAME = "odd<&>\"'$(x)`y`"
LONG_NAME = "long_" + "n" * 295
UNICODE_NAME = "héllo_wörld_✓"

submitted: list = []


def run(argv, stdin=None, check=True, timeout=30, user=None):
    if user is not None:
        argv = ["runuser", "-u", user, "--", *argv]
    p = subprocess.run(argv, input=stdin, capture_output=True, text=True, timeout=timeout,
                       cwd=WORK if user is None else f"/home/{user}")
    if check and p.returncode != 0:
        raise SystemExit(f"{argv!r} failed ({p.returncode}): {p.stderr.strip()} {p.stdout.strip()}")
    return p


def submit(spec: JobSpec, user=None) -> str:
    p = run(sge_script.submit_argv(spec), stdin=sge_script.render_script(spec), user=user)
    job_id, tasks = sge_parse.parse_qsub_terse(p.stdout)
    submitted.append(job_id)
    return f"{job_id}.{tasks}" if tasks else job_id


def sleeper(name: str, seconds: int = 600, **fields) -> JobSpec:
    fields.setdefault("stdout_path", "/dev/null")
    fields.setdefault("stderr_path", "/dev/null")
    return JobSpec("/bin/sleep", [str(seconds)], name=name, **fields)


def states() -> dict:
    jobs = sge_parse.parse_jobs(run(sge.status_argv(all_users=True)).stdout)
    return {job.job_id: job.native_state for job in jobs}


def wait_state(job_id: str, wanted, limit=30.0) -> str:
    deadline = time.monotonic() + limit
    seen = ""
    while time.monotonic() < deadline:
        seen = states().get(job_id, "")
        if seen in wanted:
            return seen
        time.sleep(0.2)
    raise SystemExit(f"job {job_id} did not reach {wanted} (is {seen!r})")


def wait_gone(job_ids, limit=60.0) -> None:
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        current = states()
        if not any(j in current or any(k.split(".")[0] == j for k in current) for j in job_ids):
            return
        time.sleep(0.3)
    raise SystemExit(f"jobs {job_ids} still listed: {states()}")


def wait_accounting(job_id: str, records=1, limit=20.0) -> str:
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        p = run(sge.accounting_argv(job_id), check=False)
        if p.returncode == 0 and len(sge_parse.parse_qacct(p.stdout)) >= records:
            return p.stdout
        time.sleep(0.3)
    raise SystemExit(f"no accounting record for job {job_id}")


class Capture:
    def __init__(self, outdir: str) -> None:
        self.outdir = outdir
        self.roles: dict = {}

    def save(self, name: str, text: str) -> None:
        with open(os.path.join(self.outdir, name), "w", encoding="utf-8", newline="") as f:
            f.write(text)
        print(f"  {name}: {len(text)} chars", file=sys.stderr)

    def query(self, name: str, argv, check=True) -> str:
        p = run(argv, check=check)
        self.save(name, p.stdout if p.returncode == 0 else
                  "$ " + " ".join(argv) + f"\nexit {p.returncode}\n" + p.stdout + p.stderr)
        return p.stdout

    def role(self, name: str, job_id: str, state: str, **extra) -> None:
        self.roles[name] = {"id": job_id, "state": state, **extra}


def execd_pid() -> int:
    with open(EXECD_PID) as f:
        return int(f.read().strip())


def phase_transfer_and_delete(cap: Capture) -> None:
    """Jobs in transfer (t), deleted in transfer (dt), while running (dr) and while
    suspended (ds): the execution daemon is stopped so these passing states stay."""
    running = submit(sleeper("del_running"))
    suspended = submit(sleeper("del_suspended"))
    wait_state(running, ("r",))
    wait_state(suspended, ("r",))
    run(sge.suspend_argv(suspended))
    wait_state(suspended, ("s",))
    pid = execd_pid()
    os.kill(pid, signal.SIGSTOP)
    try:
        transfer = submit(sleeper("transfer"))
        wait_state(transfer, ("t",))
        cap.query("qstat-transfer.xml", sge.status_argv())
        cap.role("transfer", transfer, "t")
        for job in (running, suspended, transfer):
            run(sge.delete_argv(job))
        wait_state(running, ("dr",))
        wait_state(suspended, ("ds",))
        wait_state(transfer, ("dt",))
        cap.query("qstat-deleting.xml", sge.status_argv())
        cap.role("deleted_running", running, "dr")
        cap.role("deleted_suspended", suspended, "ds")
        cap.role("deleted_transfer", transfer, "dt")
    finally:
        os.kill(pid, signal.SIGCONT)
    wait_gone([running, suspended, transfer])
    cap.save("qacct-deleted-running.txt", wait_accounting(running))


def phase_finished(cap: Capture) -> None:
    """Jobs that end: exit 0, exit 3, over their wall time, rescheduled once."""
    ok = submit(JobSpec("/bin/true", name="exit0", stdout_path="/dev/null", stderr_path="/dev/null"))
    fail = submit(JobSpec("/bin/sh", ["-c", "exit 3"], name="exit3", stdout_path="/dev/null",
                          stderr_path="/dev/null"))
    limit = submit(sleeper("over_h_rt", 60, wall_time=2))
    resched = submit(sleeper("rescheduled", 4, native_options=("-r", "y")))
    wait_state(resched, ("r",))
    run(["qmod", "-rj", resched])
    cap.role("rescheduled_queued", resched, "Rq", state_seen=wait_state(resched, ("Rq", "Rt", "Rr")))
    # It reruns only once the execution daemon has reported the first run cleaned up, which
    # can take one or two load report intervals (40 s each by default).
    wait_state(resched, ("Rr",), limit=200)
    cap.query("qstat-rescheduled.xml", sge.status_argv())
    cap.role("rescheduled_running", resched, "Rr")
    wait_gone([ok, fail, limit, resched])
    cap.save("qacct-exit0.txt", wait_accounting(ok))
    cap.save("qacct-exit3.txt", wait_accounting(fail))
    cap.save("qacct-h_rt.txt", wait_accounting(limit))
    cap.save("qacct-rescheduled.txt", wait_accounting(resched, records=2))
    cap.role("exit0", ok, "exited", exit_code=0)
    cap.role("exit3", fail, "exited", exit_code=3)
    cap.role("over_h_rt", limit, "failed", exit_code=137)
    cap.role("rescheduled", resched, "exited", exit_code=0, records=2)
    cap.query("qacct-unknown.txt", sge.accounting_argv("999999"), check=False)


def phase_listing(cap: Capture) -> None:
    """Everything at once: running, suspended, array tasks, pending, held, error, moved,
    odd names, another user's jobs."""
    jobs = {}
    # First, while slots are free: a job that cannot start (its output directory is missing).
    jobs["error"] = submit(sleeper("error", stdout_path="/nonexistent/dir/out"))
    wait_state(jobs["error"], ("Eqw",))
    jobs["running"] = submit(sleeper("running", queue="all.q"))
    jobs["suspended"] = submit(sleeper("suspended", queue="all.q"))
    jobs["array"] = submit(sleeper("array", queue="all.q", array="1-6%2"))
    jobs["other_running"] = submit(sleeper("other_running", queue="short.q"), user=OTHER_USER)
    jobs["odd_name"] = submit(sleeper(ODD_NAME, queue="short.q"))
    jobs["pending_pe"] = submit(sleeper("too_many_slots", num_procs=8))
    jobs["pending_gpu"] = submit(sleeper("wants_gpu", gpus=1))
    jobs["held"] = submit(sleeper("held", hold=True, wall_time=300, account="proj1"))
    jobs["moved"] = submit(sleeper("moved", hold=True, queue="all.q"))
    jobs["other_held"] = submit(sleeper("other_held", hold=True), user=OTHER_USER)
    jobs["long_name"] = submit(sleeper(LONG_NAME, hold=True))
    os.makedirs(os.path.join(WORK, "dïr ü"), exist_ok=True)
    jobs["rich"] = submit(sleeper("rich", hold=True, num_procs=2, queue="short.q", wall_time=120,
                                  memory=200, account="acct1", working_dir=os.path.join(WORK, "dïr ü"),
                                  stdout_path=os.path.join(WORK, "out wörld.txt"),
                                  stderr_path=os.path.join(WORK, "a:b.err"), array="1-3"))
    array_number = jobs["array"].split(".")[0]
    wait_state(jobs["running"], ("r",))
    wait_state(jobs["suspended"], ("r",))
    wait_state(jobs["other_running"], ("r",))
    wait_state(jobs["odd_name"], ("r",))
    wait_state(f"{array_number}.1", ("r",))
    wait_state(f"{array_number}.2", ("r",))
    run(sge.suspend_argv(jobs["suspended"]))
    run(sge.hold_argv(f"{array_number}.6"))
    run(sge.move_argv(jobs["moved"], "short.q", "hqw"))
    wait_state(jobs["suspended"], ("s",))
    time.sleep(1.5)
    cap.save("qsub-terse.txt", jobs["running"] + "\n")
    cap.save("qsub-terse-array.txt", jobs["array"] + "\n")
    unicode_argv = ["qsub", "-terse", "-h", "-N", UNICODE_NAME, "-o", "/dev/null", "-e", "/dev/null"]
    p = run(unicode_argv, stdin="#!/bin/sh\nsleep 1\n", check=False)
    cap.save("qsub-unicode-name.unsupported.txt",
             "$ " + " ".join(unicode_argv) + f"\nexit {p.returncode}\n" + p.stdout + p.stderr)

    cap.query("qstat.xml", sge.status_argv())
    cap.query("qstat-all-users.xml", sge.status_argv(all_users=True))
    cap.query("qstat-user-other.xml", sge.status_argv(user=OTHER_USER))
    cap.query("qstat-plain.xml", ["qstat", "-xml"])
    cap.query("qstat-f.xml", sge.queues_argv())
    cap.query("qstat-f-full.xml", ["qstat", "-f", "-xml", "-u", "*", "-r"])
    cap.query("qhost.xml", sge.hosts_argv())
    cap.query("qhost-plain.xml", ["qhost", "-xml"])
    cap.query("qstat-j-error.xml", sge.detail_argv([jobs["error"]]))
    cap.query("qstat-j-rich.xml", sge.detail_argv([jobs["rich"]]))
    cap.query("qstat-j-running.xml", sge.detail_argv([jobs["running"]]))
    cap.query("qstat-j-array.xml", sge.detail_argv([jobs["array"]]))
    cap.query("qstat-j-two.xml", sge.detail_argv([jobs["held"], jobs["moved"]]))
    cap.query("qstat-j-unknown.xml", sge.detail_argv(["999999"]))
    cap.query("qconf-sq-short.txt", sge.queue_config_argv("short.q"))
    cap.query("qconf-sq-all.txt", sge.queue_config_argv("all.q"))
    for role, state in (("running", "r"), ("suspended", "s"), ("other_running", "r"),
                        ("odd_name", "r"), ("pending_pe", "qw"), ("pending_gpu", "qw"),
                        ("held", "hqw"), ("moved", "hqw"), ("other_held", "hqw"),
                        ("long_name", "hqw"), ("rich", "hqw"), ("error", "Eqw")):
        cap.role(role, jobs[role], state)
    cap.role("array", jobs["array"], "r", running_tasks=[f"{array_number}.1", f"{array_number}.2"],
             pending=f"{array_number}.3-5:1", held=f"{array_number}.6")
    cap.roles["names"] = {"odd": ODD_NAME, "long": LONG_NAME, "unicode": UNICODE_NAME}

    # The queue short.q suspended (its jobs S), then disabled.
    run(["qmod", "-sq", "short.q"])
    wait_state(jobs["odd_name"], ("S",))
    cap.query("qstat-queue-suspended.xml", sge.status_argv(all_users=True))
    cap.query("qstat-f-suspended.xml", sge.queues_argv())
    cap.query("qhost-suspended.xml", sge.hosts_argv())
    run(["qmod", "-usq", "short.q"])
    run(["qmod", "-d", "short.q"])
    time.sleep(1.5)
    cap.query("qstat-f-disabled.xml", sge.queues_argv())
    run(["qmod", "-e", "short.q"])
    cap.role("queue_suspended", jobs["odd_name"], "S")


def phase_commands(cap: Capture) -> None:
    """What the job commands answer, in success and in refusal (their exit statuses lie)."""
    records = []

    def record(label: str, argv) -> None:
        p = run(argv, check=False)
        records.append({"label": label, "argv": argv, "returncode": p.returncode,
                        "stdout": p.stdout, "stderr": p.stderr})

    running = submit(sleeper("cmd_running"))
    pending = submit(sleeper("cmd_pending", hold=True))
    array = submit(sleeper("cmd_array", array="1-4%2")).split(".")[0]
    wait_state(running, ("r",))
    wait_state(f"{array}.1", ("r",))
    record("suspend running", sge.suspend_argv(running))
    record("suspend suspended", sge.suspend_argv(running))
    record("resume suspended", sge.resume_argv(running))
    record("resume running", sge.resume_argv(running))
    record("suspend pending", sge.suspend_argv(pending))
    record("suspend task", sge.suspend_argv(f"{array}.1"))
    record("hold pending", sge.hold_argv(pending))
    record("release held", sge.release_argv(pending))
    record("release not held", sge.release_argv(pending))
    record("hold task", sge.hold_argv(f"{array}.4"))
    record("hold running", sge.hold_argv(running))
    record("move pending", sge.move_argv(pending, "short.q"))
    record("move running (qalter accepts, nothing moves)", ["qalter", "-q", "short.q", running])
    record("move task", ["qalter", "-q", "short.q", f"{array}.3"])
    record("move to unknown queue", sge.move_argv(pending, "nosuch.q"))
    for label, job in (("unknown", "999999"),):
        record(f"delete {label}", sge.delete_argv(job))
        record(f"hold {label}", sge.hold_argv(job))
        record(f"release {label}", sge.release_argv(job))
        record(f"suspend {label}", sge.suspend_argv(job))
        record(f"resume {label}", sge.resume_argv(job))
        record(f"move {label}", sge.move_argv(job, "short.q"))
    record("delete pending tasks", sge.delete_argv(f"{array}.3,4"))
    record("delete running", sge.delete_argv(running))
    record("delete deleting", sge.delete_argv(running))
    record("delete pending", sge.delete_argv(pending))
    record("delete array", sge.delete_argv(array))
    cap.save("commands.json", json.dumps(records, indent=2, ensure_ascii=False) + "\n")


def phase_host_down(cap: Capture) -> None:
    """The execution daemon shut down: its host and queue instances unknown (u)."""
    host = sge_parse.parse_hosts(run(sge.hosts_argv()).stdout)[0].name
    pid = execd_pid()
    run(["qconf", "-ke", host])
    deadline = time.monotonic() + 20
    while os.path.exists(f"/proc/{pid}") and time.monotonic() < deadline:
        time.sleep(0.2)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        instances = sge_parse.parse_queue_instances(run(sge.queues_argv()).stdout)
        if any("u" in qi.state for qi in instances):
            break
        time.sleep(0.5)
    cap.query("qstat-f-host-down.xml", sge.queues_argv())
    cap.query("qhost-host-down.xml", sge.hosts_argv())
    run(["/etc/init.d/gridengine-exec", "start"])
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if not any(qi.state for qi in sge_parse.parse_queue_instances(run(sge.queues_argv()).stdout)):
            return
        time.sleep(0.5)
    raise SystemExit("the execution daemon did not come back")


def main(phases) -> None:
    if os.geteuid() != 0:
        raise SystemExit("run as root (it stops and restarts the execution daemon)")
    version = run(["qstat", "-help"]).stdout.splitlines()[0].split()[-1]
    outdir = os.path.join(HERE, version)
    os.makedirs(outdir, exist_ok=True)
    os.makedirs(WORK, exist_ok=True)
    if states():
        raise SystemExit(f"the cell has jobs already: {states()}; run this on an idle cell")
    cap = Capture(outdir)
    cap.roles["tz"] = time.strftime("%Z %z")
    roles_file = os.path.join(outdir, "roles.json")
    if set(phases) != set(PHASES) and os.path.exists(roles_file):
        # Re-recording some phases: keep the roles the others recorded.
        with open(roles_file, encoding="utf-8") as f:
            cap.roles.update(json.load(f))
    for phase in phases:
        print(phase, file=sys.stderr)
        try:
            PHASES[phase](cap)
        finally:
            # Each phase starts on an idle cell (host-down above all: a daemon restarted
            # under running jobs keeps showing them for a minute).
            for job in dict.fromkeys(submitted):
                run(["qdel", "-f", job], check=False)
            wait_gone(list(dict.fromkeys(submitted)))
            submitted.clear()
    cap.save("roles.json", json.dumps(cap.roles, indent=2, ensure_ascii=False) + "\n")
    cap.save("version.txt", version + "\n")


PHASES = {
    "transfer": phase_transfer_and_delete,
    "finished": phase_finished,
    "listing": phase_listing,
    "commands": phase_commands,
    "host-down": phase_host_down,
}

if __name__ == "__main__":
    chosen = sys.argv[1:] or list(PHASES)
    unknown = [p for p in chosen if p not in PHASES]
    if unknown:
        raise SystemExit(f"unknown phase(s) {unknown}; phases: {' '.join(PHASES)}")
    main(chosen)
