"""Records real SLURM output for the parser tests.

    scripts/slurm-up && SLURM_CONF=/tmp/proxy-agent-slurm/slurm.conf \\
        .venv/bin/python tests/data/slurm/capture.py

Needs a running cluster whose node has at least 2 CPUs and partitions ``debug`` (default)
and ``long`` (as scripts/slurm-up makes), and root (it drains the node and stops a partition
for a moment). It submits jobs that end in known states, then jobs that are running, pending
and held, and saves the output of every query of ``batch.slurm.parse`` in text and, where this
SLURM has it, JSON, into ``tests/data/slurm/<version>/``. ``roles.json`` there maps each job's
role to its id and the state it was meant to reach, which the tests check. It takes about
two minutes (one job has to hit its time limit) and cancels everything it started.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.abspath(os.path.join(HERE, "..", "..", "..")))

from proxy_agent.schedulers.batch.slurm import directives  # noqa: E402
from proxy_agent.schedulers.batch.slurm import parse as sp  # noqa: E402
from proxy_agent.service.jobs import JobSpec  # noqa: E402

WORK = "/tmp/proxy-agent-capture"
ODD_NAME = 'spaces | and "quotes" $(x) `y`'
UNICODE_NAME = "héllo wörld ✓"


def run(argv, stdin=None, check=True, timeout=30):
    p = subprocess.run(argv, input=stdin, capture_output=True, text=True, timeout=timeout)
    if check and p.returncode != 0:
        raise SystemExit(f"{argv!r} failed ({p.returncode}): {p.stderr.strip()}")
    return p


def submit(spec: JobSpec, *extra: str) -> str:
    argv = directives.submit_argv(spec)
    argv[2:2] = list(extra)  # after "sbatch --parsable"
    p = run(argv, stdin=directives.job_script(spec))
    return sp.parse_sbatch_parsable(p.stdout)


def job_state(job_id: str) -> str:
    p = run(sp.scontrol_job_argv(job_id), check=False)
    jobs = sp.parse_scontrol_jobs(p.stdout)
    return jobs[0].state if jobs else ""


def wait_for(job_id: str, states, limit=150):
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        state = job_state(job_id)
        if state in states:
            return state
        time.sleep(1)
    raise SystemExit(f"job {job_id} did not reach {states} (is {job_state(job_id)!r})")


def save(outdir: str, name: str, text: str) -> None:
    with open(os.path.join(outdir, name), "w", encoding="utf-8", newline="") as f:
        f.write(text)
    print(f"  {name}: {len(text)} chars", file=sys.stderr)


def capture_all(outdir: str, suffix: str = "") -> None:
    """Every query, text and JSON; a query this cluster refuses is saved as
    ``<name>[.json].unsupported.txt`` with its error message."""

    def query(name, argv, json_flag=False):
        p = run(argv, check=False)
        if p.returncode == 0:
            save(outdir, name + suffix + (".json" if json_flag else ".txt"), p.stdout)
        else:
            save(outdir, name + suffix + (".json" if json_flag else "") + ".unsupported.txt",
                 "$ " + " ".join(argv) + f"\nexit {p.returncode}\n" + p.stdout + p.stderr)

    query("squeue", sp.squeue_argv())
    query("squeue", sp.squeue_argv(json=True), True)
    query("sinfo-nodes", sp.nodes_argv())
    query("sinfo", ["sinfo", "--json"], True)
    query("scontrol-nodes", ["scontrol", "--oneliner", "show", "node"])
    query("scontrol-nodes", ["scontrol", "show", "nodes", "--json"], True)
    query("scontrol-config", sp.config_argv())
    query("scontrol-partitions", sp.partitions_argv())
    query("scontrol-partitions", sp.partitions_argv(json=True), True)
    query("scontrol-jobs", sp.scontrol_job_argv())
    query("scontrol-jobs", sp.scontrol_job_argv(json=True), True)
    query("sacct-completion", sp.sacct_argv(completion=True, start_time="now-1day"))
    query("sacct", sp.sacct_argv(start_time="now-1day"))
    query("sacct", sp.sacct_argv(json=True, start_time="now-1day"), True)


def main() -> int:
    if os.geteuid() != 0:
        raise SystemExit("run as root: the capture drains the node and stops a partition")
    version = sp.parse_version(run(sp.version_argv()).stdout)
    vtext = "%d.%02d.%d" % version
    outdir = os.path.join(HERE, vtext)
    os.makedirs(outdir, exist_ok=True)
    os.makedirs(os.path.join(WORK, "dir with space"), exist_ok=True)
    print(f"SLURM {vtext}: capturing into {outdir}", file=sys.stderr)
    roles = {}

    def job(role, expect, spec, *extra):
        job_id = submit(spec, *extra)
        roles[role] = {"job_id": job_id, "expect": expect}
        print(f"  {role}: job {job_id}", file=sys.stderr)
        return job_id

    w = WORK
    # Jobs that finish before the capture.
    ok = job("completed", "COMPLETED", JobSpec("/bin/echo", ["hello"], working_dir=w, name="ok"))
    bad = job("failed", "FAILED", JobSpec("/bin/sh", ["-c", "exit 3"], working_dir=w, name="exit3"))
    sig = job("signaled", "FAILED", JobSpec("/bin/sh", ["-c", "kill -9 $$"], working_dir=w, name="sigkill"))
    for j in (ok, bad, sig):
        wait_for(j, ("COMPLETED", "FAILED"))
    tmo = job("timeout", "TIMEOUT", JobSpec("/bin/sleep", ["600"], working_dir=w, name="too-slow",
                                                   queue="long", wall_time=60))
    runc = job("cancelled_running", "CANCELLED", JobSpec("/bin/sleep", ["600"], working_dir=w, name="cancel-me"))
    held = job("cancelled_pending", "CANCELLED", JobSpec("/bin/sleep", ["1"], working_dir=w, name="never-runs"), "--hold")
    wait_for(runc, ("RUNNING",))
    run(sp.scancel_argv(runc))
    run(sp.scancel_argv(held))
    print("  waiting for the time limit of job", tmo, file=sys.stderr)
    wait_for(tmo, ("TIMEOUT",), limit=240)

    # Jobs alive during the capture (2 CPUs: two run, the rest wait).
    r1 = job("running_odd_name", "RUNNING", JobSpec("/bin/sleep", ["3000"], working_dir=w, name=ODD_NAME))
    r2 = job("suspended_unicode", "SUSPENDED", JobSpec(
        "/bin/sleep", ["3000"], working_dir=os.path.join(w, "dir with space"), name=UNICODE_NAME,
        queue="long", stdout_path=os.path.join(w, "dir with space", "out-%j.txt")))
    wait_for(r1, ("RUNNING",))
    wait_for(r2, ("RUNNING",))
    run(sp.suspend_job_argv(r2))
    job("pending_resources", "PENDING", JobSpec("/bin/sleep", ["60"], working_dir=w, name="waits",
                                                      num_procs=2))
    moved = job("pending_moved", "PENDING", JobSpec("/bin/sleep", ["60"], working_dir=w, name="moved-to-long"))
    run(sp.move_job_argv(moved, "long"))
    job("held", "PENDING", JobSpec("/bin/true", working_dir=w, name="held"), "--hold")
    job("held_array", "PENDING", JobSpec("/bin/true", working_dir=w, name="array"), "--hold", "--array=1-3")
    job("dependency", "PENDING", JobSpec("/bin/true", working_dir=w, name="after-r1"),
        f"--dependency=afterok:{r1}")
    time.sleep(2)
    save(outdir, "version.txt", run(sp.version_argv()).stdout)
    capture_all(outdir)

    # Node draining (jobs still run on it) and a stopped partition.
    node = sp.parse_scontrol_nodes(run(["scontrol", "--oneliner", "show", "node"]).stdout)[0].name
    run(["scontrol", "update", f"NodeName={node}", "State=DRAIN", "Reason=disk check, ticket #42"])
    run(["scontrol", "update", "PartitionName=long", "State=DOWN"])
    time.sleep(1)
    try:
        save(outdir, "sinfo-nodes-drain.txt", run(sp.nodes_argv()).stdout)
        save(outdir, "sinfo-drain.json", run(sp.nodes_argv(json=True, version=version)).stdout)
        save(outdir, "scontrol-nodes-drain.txt", run(["scontrol", "--oneliner", "show", "node"]).stdout)
        save(outdir, "scontrol-partitions-down.txt", run(sp.partitions_argv()).stdout)
    finally:
        run(["scontrol", "update", f"NodeName={node}", "State=RESUME"])
        run(["scontrol", "update", "PartitionName=long", "State=UP"])

    # One record through the multi-line scontrol layout too.
    save(outdir, "scontrol-job-multiline.txt", run(["scontrol", "show", "job", r1]).stdout)

    with open(os.path.join(outdir, "roles.json"), "w") as f:
        # Times in the text listings are local: the tests render JSON epochs in this zone.
        json.dump({"version": vtext, "timezone": os.environ.get("TZ") or time.strftime("%Z"),
                   "utc_offset": time.strftime("%z"), "node": node, "odd_name": ODD_NAME,
                   "unicode_name": UNICODE_NAME, "jobs": roles}, f, indent=1, ensure_ascii=False)
        f.write("\n")
    for role, info in roles.items():
        if info["expect"] in ("RUNNING", "PENDING", "SUSPENDED"):
            run(sp.scancel_argv(info["job_id"]), check=False)
    print("done", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
