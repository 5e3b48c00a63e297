"""Synthesizes large SLURM listings in the formats batch.slurm.parse reads, for tests and benchmarks.

    python tests/data/slurm/make_large.py OUTDIR [--jobs 100000] [--nodes 10000]

writes squeue.txt, squeue-22.05.json, squeue-23.11.json, sinfo-nodes.txt, scontrol-nodes.txt,
sinfo-22.05.json, scontrol-jobs.txt and sacct.txt into OUTDIR. The same functions are imported
by the tests and by scripts/bench_slurm_parse.py (load this file by path: tests/data is not a
package). Output is deterministic: the same counts give the same bytes.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from proxy_agent.schedulers.batch.slurm.parse import FIELD_SEP, RECORD_SEP, SQUEUE_FIELDS

_STATES = ("RUNNING", "PENDING", "PENDING", "COMPLETED", "FAILED", "CANCELLED", "TIMEOUT",
           "COMPLETING", "SUSPENDED", "CONFIGURING")
_REASONS = {"RUNNING": "None", "PENDING": "Resources", "COMPLETED": "None",
            "FAILED": "NonZeroExitCode", "CANCELLED": "None", "TIMEOUT": "TimeLimit",
            "COMPLETING": "None", "SUSPENDED": "None", "CONFIGURING": "None"}
_PARTITIONS = ("debug", "long", "gpu", "bigmem")
_BASE_EPOCH = 1_700_000_000


def _job(i: int):
    """Field values of synthetic job i, shared by every format so they parse alike."""
    state = _STATES[i % len(_STATES)]
    started = state not in ("PENDING",)
    n_nodes = 1 + i % 4
    first = i % 10_000
    nodes = f"node[{first:05d}-{first + n_nodes - 1:05d}]" if started else ""
    status = 0 if state != "FAILED" else (1 + i % 5) << 8
    return {
        "job_id": 1_000_000 + i,
        "name": f"job {i} | sweep=\"{i % 97}\"" if i % 13 == 0 else f"run_{i}",
        "user": f"user{i % 257}",
        "account": f"proj{i % 31}",
        "partition": _PARTITIONS[i % len(_PARTITIONS)],
        "state": state,
        "reason": _REASONS[state],
        "nodes": nodes,
        "num_nodes": n_nodes,
        "num_cpus": n_nodes * 16,
        "num_tasks": n_nodes * 16,
        "used": (i * 37) % 86_000 if started else 0,
        "limit_min": (60, 600, 1440, 2880)[i % 4],
        "status": status,
        "submit": _BASE_EPOCH + i,
        "start": _BASE_EPOCH + i + 30 if started else 0,
        "workdir": f"/home/user{i % 257}/work/{i % 1000}",
    }


def _dur(seconds: int) -> str:
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}-{hours:02d}:{minutes:02d}:{secs:02d}"
    if hours:
        return f"{hours}:{minutes:02d}:{secs:02d}"
    return f"{minutes}:{secs:02d}"


def _iso(epoch: int) -> str:
    # Fixed UTC rendering: synthetic data only needs to be plausible and deterministic.
    import time
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(epoch)) if epoch else "N/A"


def squeue_text(n: int) -> str:
    """n jobs in the squeue --Format layout of batch.slurm.parse.squeue_argv()."""
    assert [a for _f, a in SQUEUE_FIELDS][-1] == "name"
    out = []
    for i in range(n):
        j = _job(i)
        fields = [
            str(j["job_id"]), str(j["job_id"]), "N/A", j["user"], j["account"], j["partition"],
            j["state"], j["reason"], j["nodes"], str(j["num_nodes"]), str(j["num_cpus"]),
            str(j["num_tasks"]), _dur(j["used"]), _dur(j["limit_min"] * 60), str(j["status"]),
            _iso(j["submit"]), _iso(j["start"]), "N/A", j["workdir"],
            j["workdir"] + f"/slurm-{j['job_id']}.out", j["workdir"] + f"/slurm-{j['job_id']}.out",
            j["name"],
        ]
        out.append(FIELD_SEP.join(fields) + RECORD_SEP + "\n")
    return "".join(out)


def _num_obj(n, infinite=False, set_=True):
    return {"set": set_, "infinite": infinite, "number": n}


def squeue_json(n: int, layout: str = "22.05") -> str:
    """n jobs as squeue --json prints them: layout "22.05" (plain numbers, string states)
    or "23.11" (number objects, state lists, exit-code objects)."""
    jobs = []
    new = layout != "22.05"
    for i in range(n):
        j = _job(i)
        wrap = _num_obj if new else (lambda v: v)
        job = {
            "account": j["account"],
            "array_job_id": wrap(0),
            "array_task_id": _num_obj(0, set_=False) if new else None,
            "array_task_string": "",
            "cpus": wrap(j["num_cpus"]),
            "current_working_directory": j["workdir"],
            "end_time": wrap(0),
            "job_id": j["job_id"],
            "job_state": [j["state"]] if new else j["state"],
            "name": j["name"],
            "node_count": wrap(j["num_nodes"]),
            "nodes": j["nodes"],
            "partition": j["partition"],
            "standard_error": "",
            "standard_output": "",
            "start_time": wrap(j["start"]),
            "state_reason": j["reason"],
            "submit_time": wrap(j["submit"]),
            "tasks": wrap(j["num_tasks"]),
            "time_limit": wrap(j["limit_min"]),
            "user_name": j["user"],
        }
        if new:
            status = j["status"]
            job["exit_code"] = {
                "status": ["SUCCESS" if status == 0 else "ERROR"],
                "return_code": _num_obj(status >> 8),
                "signal": {"id": _num_obj(0, set_=False), "name": ""},
            }
        else:
            job["exit_code"] = j["status"]
        jobs.append(job)
    meta = {"Slurm": {"version": {"major": 22, "minor": 5, "micro": 8}, "release": "22.05.8"}}
    if new:
        meta = {"slurm": {"version": {"major": "23", "minor": "11", "micro": "4"},
                          "release": "23.11.4"}}
    return json.dumps({"meta": meta, "errors": [], "jobs": jobs})


def _node(i: int):
    states = ("idle", "mixed", "allocated", "drained", "idle*", "down*", "draining", "mixed")
    return {
        "name": f"node{i:05d}",
        "state": states[i % len(states)],
        "cpus": 64,
        "memory": 256_000,
        "partitions": ["debug", "long"] if i % 2 else ["debug"],
        "reason": "bad DIMM, ticket 42" if "drain" in states[i % len(states)] else "none",
    }


def sinfo_nodes_text(n: int) -> str:
    """n nodes in the sinfo --Node layout of batch.slurm.parse.nodes_argv() (a line per partition)."""
    out = []
    for i in range(n):
        nd = _node(i)
        for k, p in enumerate(nd["partitions"]):
            part = p + "*" if p == "debug" else p
            out.append(FIELD_SEP.join([nd["name"], nd["state"], str(nd["cpus"]), str(nd["memory"]),
                                       part, f"{i % 64}/{64 - i % 64}/0/64", nd["reason"]]) + "\n")
    return "".join(out)


def scontrol_nodes_text(n: int) -> str:
    """n nodes as ``scontrol -o show node`` prints them."""
    upper = {"idle": "IDLE", "mixed": "MIXED", "allocated": "ALLOCATED", "drained": "IDLE+DRAIN",
             "idle*": "IDLE*", "down*": "DOWN*", "draining": "MIXED+DRAIN"}
    out = []
    for i in range(n):
        nd = _node(i)
        reason = "" if nd["reason"] == "none" else f" Reason={nd['reason']} [root@2024-01-01T00:00:00]"
        out.append(
            f"NodeName={nd['name']} Arch=x86_64 CoresPerSocket=32  CPUAlloc={i % 64} CPUEfctv=64 "
            f"CPUTot=64 CPULoad=1.00 AvailableFeatures=(null) ActiveFeatures=(null) Gres=(null) "
            f"NodeAddr={nd['name']} NodeHostName={nd['name']} Version=22.05.8 "
            f"OS=Linux 6.1.0 #1 SMP  RealMemory=256000 AllocMem=0 FreeMem=200000 Sockets=2 "
            f"Boards=1 State={upper[nd['state']]} ThreadsPerCore=1 TmpDisk=0 Weight=1 "
            f"Owner=N/A MCS_label=N/A Partitions={','.join(nd['partitions'])}  "
            f"BootTime=2024-01-01T00:00:00 SlurmdStartTime=2024-01-01T00:00:00 "
            f"LastBusyTime=2024-01-01T00:00:00 CfgTRES=cpu=64,mem=250G,billing=64 AllocTRES= "
            f"CapWatts=n/a CurrentWatts=0 AveWatts=0 ExtSensorsJoules=n/s ExtSensorsWatts=0 "
            f"ExtSensorsTemp=n/s{reason}\n")
    return "".join(out)


def sinfo_nodes_json(n: int) -> str:
    """n nodes as ``sinfo --json`` prints them on 22.05."""
    nodes = []
    for i in range(n):
        nd = _node(i)
        state = nd["state"].rstrip("*")
        flags = []
        if state == "drained":
            state, flags = "idle", ["DRAIN"]
        elif state == "draining":
            state, flags = "mixed", ["DRAIN"]
        if nd["state"].endswith("*"):
            flags.append("NOT_RESPONDING")
        nodes.append({"name": nd["name"], "state": state, "state_flags": flags, "cpus": 64,
                      "alloc_cpus": i % 64, "real_memory": 256000, "partitions": nd["partitions"],
                      "reason": "" if nd["reason"] == "none" else nd["reason"]})
    return json.dumps({"meta": {}, "errors": [], "nodes": nodes})


def scontrol_jobs_text(n: int) -> str:
    """n jobs as ``scontrol -o show job`` prints them."""
    out = []
    for i in range(n):
        j = _job(i)
        status = j["status"]
        out.append(
            f"JobId={j['job_id']} JobName={j['name']} UserId={j['user']}(1000) GroupId=users(100) "
            f"MCS_label=N/A Priority=1 Nice=0 Account={j['account']} QOS=normal "
            f"JobState={j['state']} Reason={j['reason']} Dependency=(null) Requeue=1 Restarts=0 "
            f"BatchFlag=1 Reboot=0 ExitCode={status >> 8}:0 RunTime={_dur(j['used'])} "
            f"TimeLimit={_dur(j['limit_min'] * 60)} TimeMin=N/A SubmitTime={_iso(j['submit'])} "
            f"StartTime={_iso(j['start'])} EndTime=Unknown Partition={j['partition']} "
            f"NodeList={j['nodes'] or '(null)'} NumNodes={j['num_nodes']} NumCPUs={j['num_cpus']} "
            f"NumTasks={j['num_tasks']} CPUs/Task=1 ReqB:S:C:T=0:0:*:* "
            f"TRES=cpu={j['num_cpus']},node={j['num_nodes']} Command=(null) WorkDir={j['workdir']} "
            f"StdErr={j['workdir']}/slurm-{j['job_id']}.out StdIn=/dev/null "
            f"StdOut={j['workdir']}/slurm-{j['job_id']}.out Power=\n")
    return "".join(out)


def sacct_text(n: int) -> str:
    """n jobs in the sacct layout of batch.slurm.parse.sacct_argv()."""
    out = []
    for i in range(n):
        j = _job(i)
        out.append(FIELD_SEP.join([
            str(j["job_id"]), str(j["job_id"]), j["user"], j["account"], j["partition"],
            j["state"], j["reason"], j["nodes"] or "None assigned", str(j["num_nodes"]),
            str(j["num_cpus"]), "", _dur(j["used"]), _dur(j["limit_min"] * 60),
            f"{j['status'] >> 8}:0", _iso(j["submit"]), _iso(j["start"]), "Unknown",
            j["workdir"], j["name"]]) + "\n")
    return "".join(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("outdir")
    ap.add_argument("--jobs", type=int, default=100_000)
    ap.add_argument("--nodes", type=int, default=10_000)
    args = ap.parse_args(argv)
    os.makedirs(args.outdir, exist_ok=True)
    files = {
        "squeue.txt": squeue_text(args.jobs),
        "squeue-22.05.json": squeue_json(args.jobs, "22.05"),
        "squeue-23.11.json": squeue_json(args.jobs, "23.11"),
        "scontrol-jobs.txt": scontrol_jobs_text(args.jobs),
        "sacct.txt": sacct_text(args.jobs),
        "sinfo-nodes.txt": sinfo_nodes_text(args.nodes),
        "scontrol-nodes.txt": scontrol_nodes_text(args.nodes),
        "sinfo-22.05.json": sinfo_nodes_json(args.nodes),
    }
    for name, text in files.items():
        with open(os.path.join(args.outdir, name), "w", encoding="utf-8") as f:
            f.write(text)
        print(f"{name}: {len(text.encode()):,} bytes", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
