"""A small stand-in for a PBS server and its commands, for end-to-end tests of the PBS
backend where no PBS can run.

The executables in ``bin/`` (qstat, qsub, qdel, qhold, qrls, qsig, qmove, qmgr, pbsnodes,
tracejob, pbsdsh) all land in :func:`main`. They keep the "server" in a state directory and
print what the real commands print, in the formats of ``tests/data/pbs``:

* ``FAKE_PBS_FAMILY``: ``openpbs`` (default; JSON as OpenPBS 20-23 writes it, numbers and
  number-like names unquoted) or ``torque`` (XML and text, completed jobs kept as ``C``).
* ``FAKE_PBS_STATE``: the state directory (required).
* ``FAKE_PBS_QUEUE_SECONDS``: how long a job waits before it starts (default 1).
* ``FAKE_PBS_KEEP_COMPLETED``: how long Torque lists a completed job (default 300).
* ``FAKE_PBS_PRIVILEGED=1``: allow ``qsig -s suspend|resume`` (PBS wants an operator).

Jobs really run: when a job's time in the queue is over, the next command starts its script
with bash (``-S``) in the background, in the submitter's home directory, with PBS's job
variables and a node file of one line per slot; its output goes to the requested files
(straight away with OpenPBS's ``-k d``, copied at the end otherwise, as Torque does). qdel
sends SIGTERM to the job (exit status 271), qsig suspend/resume SIGSTOP/SIGCONT, a job past
its walltime is killed (OpenPBS -29, Torque -11). Progress happens whenever a command runs.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from typing import Dict, List, NoReturn, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
FAMILY = os.environ.get("FAKE_PBS_FAMILY", "openpbs")
SERVER = "fake-head"
VERSION = {"openpbs": "20.0.1", "torque": "6.1.3"}
QUEUES = {"openpbs": ["workq", "long"], "torque": ["batch", "short"]}
NODES = [("fn01", 4), ("fn02", 4)]
OPTIONS = {
    "openpbs": ("aAcCeJjklmMNopPqrRSuvW", "fGhIVXz"),
    "torque": ("aAbcCdDeFijkKlLmMNopPqrStTuvwW", "fhInVxXz"),
}


def fail(message: str, code: int = 1) -> NoReturn:
    sys.stderr.write(message + "\n")
    sys.exit(code)


# ------------------------------------------------------------------------------ state


def state_dir() -> str:
    path = os.environ.get("FAKE_PBS_STATE")
    if not path:
        fail("fake PBS: FAKE_PBS_STATE is not set")
    os.makedirs(os.path.join(path, "jobs"), exist_ok=True)
    return path


@contextmanager
def server():
    """The server state, locked for the whole command and saved after it."""
    root = state_dir()
    with open(os.path.join(root, "lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        path = os.path.join(root, "state.json")
        state = {"next": 0, "jobs": {}}  # a fresh server numbers its jobs from 0
        if os.path.exists(path):
            with open(path, encoding="utf-8") as f:
                state = json.load(f)
        advance(root, state)
        yield root, state
        tmp = path + ".tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(state, f)
        os.replace(tmp, path)


def seconds(env: str, default: float) -> float:
    try:
        return float(os.environ.get(env, default))
    except ValueError:
        return default


def trace(root: str, job: dict, source: str, message: str) -> None:
    stamp = time.strftime("%m/%d/%Y %H:%M:%S")
    with open(os.path.join(root, "jobs", f"{job['seq']}.trace"), "a", encoding="utf-8") as f:
        f.write(f"{stamp}  {source}    {message}\n")


FINAL = "F" if FAMILY == "openpbs" else "C"


def advance(root: str, state: dict) -> None:
    """Start jobs whose wait is over, notice jobs that ended, forget old Torque jobs."""
    now = time.time()
    wait = seconds("FAKE_PBS_QUEUE_SECONDS", 1.0)
    for job in list(state["jobs"].values()):
        if job.get("array"):
            continue
        total = sum(cpus for _name, cpus in NODES)
        if job["state"] == "Q" and job["procs"] > total:
            # what the real scheduler says of a job asking for more than every node has
            job["comment"] = (f"Can Never Run: Insufficient amount of resource: ncpus "
                              f"(R: {job['procs']} A: {total} T: {total})")
        elif job["state"] in ("Q", "W") and now >= max(job["queued_since"] + wait, job.get("begin") or 0):
            start(root, job)
        elif job["state"] in ("R", "S", "E"):
            exit_path = os.path.join(root, "jobs", f"{job['seq']}.exit")
            if os.path.exists(exit_path):
                with open(exit_path) as f:
                    status = int(f.read().strip())
                finish(root, job, status)
    for job in state["jobs"].values():
        if job.get("array"):
            derive_array(state, job)
    if FAMILY == "torque":
        keep = seconds("FAKE_PBS_KEEP_COMPLETED", 300.0)
        for job_id, job in list(state["jobs"].items()):
            if job["state"] == "C" and now - (job.get("end") or now) > keep:
                del state["jobs"][job_id]


def start(root: str, job: dict) -> None:
    job["state"] = "R"
    job["start"] = time.time()
    slots = job["procs"]
    per_node = max(1, -(-slots // len(NODES)))
    hosts = []
    remaining = slots
    for name, _cpus in NODES:
        if remaining <= 0:
            break
        take = min(per_node, remaining)
        hosts.append((name, take))
        remaining -= take
    if FAMILY == "openpbs":
        job["exec_host"] = "+".join(f"{h}/0*{n}" for h, n in hosts)
    else:
        job["exec_host"] = "+".join(f"{h}/0-{n - 1}" if n > 1 else f"{h}/0" for h, n in hosts)
    trace(root, job, "S", f"Job Run at request of Scheduler@{SERVER} on exec_vnode {job['exec_host']}")
    # The runner reads the job from its own file: the state file is saved only after this
    # command finishes.
    with open(os.path.join(root, "jobs", f"{job['seq']}.job"), "w", encoding="utf-8") as f:
        json.dump(job, f)
    subprocess.Popen(
        [sys.executable, os.path.join(HERE, "fakepbs.py"), "_run", root, str(job["seq"])],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        close_fds=True,
        env=dict(os.environ),
    )


def finish(root: str, job: dict, status: int) -> None:
    job["state"] = FINAL if not job.get("parent") or FAMILY == "torque" else "X"
    job["exit"] = status
    job["end"] = time.time()
    if job.get("cancelled"):
        trace(root, job, "S", f"Job deleted at request of {job['owner']}")
    trace(root, job, "S", f"Exit_status={status} resources_used.walltime={hms(job['end'] - job['start'])}")
    trace(
        root, job, "A",
        f"user={job['user']} group=users jobname={job['name']} queue={job['queue']} "
        f"ctime={int(job['ctime'])} start={int(job['start'])} exec_host={job['exec_host']} "
        f"end={int(job['end'])} Exit_status={status} resources_used.walltime={hms(job['end'] - job['start'])}",
    )


def derive_array(state: dict, parent: dict) -> None:
    children = [state["jobs"][c] for c in parent["children"] if c in state["jobs"]]
    states = [c["state"] for c in children]
    done = [s in ("F", "X", "C") for s in states]
    if children and all(done):
        parent["state"] = FINAL
        codes = [c.get("exit") for c in children]
        parent["exit"] = 0 if all(c == 0 for c in codes) else 1
        parent["end"] = max(c.get("end") or 0 for c in children)
        parent["cancelled"] = all(c.get("cancelled") for c in children)
    elif any(s in ("R", "S", "E") for s in states) or any(done):
        parent["state"] = "B" if FAMILY == "openpbs" else "R"
        starts = [c["start"] for c in children if c.get("start")]
        parent["start"] = min(starts) if starts else None
    elif states and all(s == "H" for s in states):
        parent["state"] = "H"
    else:
        parent["state"] = "Q"


def hms(value: float) -> str:
    total = int(value)
    return f"{total // 3600:02d}:{total % 3600 // 60:02d}:{total % 60:02d}"


# ------------------------------------------------------------------------------ the job runner


def run_job(root: str, seq: str) -> None:
    """Runs in the background: the job's script, its output, its exit status."""
    with open(os.path.join(root, "jobs", f"{seq}.job"), encoding="utf-8") as f:
        job = json.load(f)
    spool = os.path.join(root, "jobs")
    node_file = os.path.join(spool, f"{seq}.nodes")
    with open(node_file, "w") as f:
        for entry in job["exec_host"].split("+"):
            host, _, slots = entry.partition("/")
            count = int(slots.split("*")[1]) if "*" in slots else (
                int(slots.split("-")[1]) + 1 if "-" in slots else 1)
            f.write(f"{host}\n" * count)
    direct = FAMILY == "openpbs" and "d" in job.get("keep", "")
    out_final = job["stdout"]
    err_final = job["stderr"]
    out_path = out_final if direct else os.path.join(spool, f"{seq}.OU")
    err_path = err_final if direct else os.path.join(spool, f"{seq}.ER")
    env = dict(job["env"])
    env.update(
        PBS_JOBID=job["id"], PBS_JOBNAME=job["name"], PBS_QUEUE=job["queue"],
        PBS_NODEFILE=node_file, PBS_O_WORKDIR=job["workdir"], PBS_ENVIRONMENT="PBS_BATCH",
        PATH=job["env"].get("PATH", "/usr/bin:/bin"),
    )
    if job.get("index") is not None:
        env["PBS_ARRAY_INDEX" if FAMILY == "openpbs" else "PBS_ARRAYID"] = str(job["index"])
    try:
        out = open(out_path, "wb")
        err = out if job.get("join") == "oe" or out_final == err_final else open(err_path, "wb")
    except OSError:
        status = -9 if FAMILY == "torque" else -1
        write_exit(spool, seq, status)
        return
    child = subprocess.Popen(
        [job["shell"], os.path.join(spool, f"{seq}.sh")],
        cwd=env.get("HOME", "/"), env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=err,
        start_new_session=True,
    )
    with open(os.path.join(spool, f"{seq}.pgid"), "w") as f:
        f.write(str(child.pid))
    limit = job.get("walltime")
    try:
        code = child.wait(timeout=limit)
        status = code if code >= 0 else 256 - code
    except subprocess.TimeoutExpired:
        os.killpg(child.pid, signal.SIGKILL)
        child.wait()
        status = -29 if FAMILY == "openpbs" else -11
    out.close()
    if err is not out:
        err.close()
    if not direct:
        for spooled, final in ((out_path, out_final), (err_path, err_final)):
            if os.path.exists(spooled) and (spooled == out_path or err is not out):
                try:
                    shutil.copyfile(spooled, final)
                except OSError:
                    pass
    write_exit(spool, seq, status)


def write_exit(spool: str, seq: int, status: int) -> None:
    tmp = os.path.join(spool, f"{seq}.exit.tmp")
    with open(tmp, "w") as f:
        f.write(str(status))
    os.replace(tmp, os.path.join(spool, f"{seq}.exit"))


# ------------------------------------------------------------------------------ qsub


def parse_options(argv: List[str], command: str):
    with_value, flags = OPTIONS[FAMILY]
    options: List[tuple] = []
    i = 0
    while i < len(argv):
        element = argv[i]
        if element == "--" or not element.startswith("-") or element == "-":
            break
        j = 1
        while j < len(element):
            letter = element[j]
            if letter in with_value:
                value = element[j + 1 :]
                if not value:
                    i += 1
                    if i >= len(argv):
                        fail(f"{command}: option requires an argument -- '{letter}'", 2)
                    value = argv[i]
                options.append((letter, value))
                break
            if letter in flags:
                options.append((letter, None))
                j += 1
                continue
            fail(f"{command}: invalid option -- '{letter}'\nusage: {command} [options] [script]", 2)
        i += 1
    return options, argv[i:]


def resources(values: List[str]) -> Dict[str, str]:
    result: Dict[str, str] = {}
    for value in values:
        for item in value.split(","):
            key, _, val = item.partition("=")
            result[key] = val
    return result


def procs_of(res: Dict[str, str]) -> int:
    if "select" in res:
        total = 0
        for chunk in res["select"].split("+"):
            parts = chunk.split(":")
            count = int(parts[0]) if parts[0].isdigit() else 1
            settings = dict(p.partition("=")[::2] for p in parts if "=" in p)
            total += count * int(settings.get("mpiprocs", 1))
        return total
    if "nodes" in res:
        total = 0
        for part in res["nodes"].split("+"):
            pieces = part.split(":")
            count = int(pieces[0]) if pieces[0].isdigit() else 1
            ppn = next((int(p[4:]) for p in pieces if p.startswith("ppn=")), 1)
            total += count * ppn
        return total
    return int(res.get("ncpus", 1))


def walltime_seconds(text: Optional[str]) -> Optional[int]:
    if not text:
        return None
    total = 0
    for part in text.split(":"):
        total = total * 60 + int(part)
    return total


def qsub(argv: List[str]) -> None:
    options, operands = parse_options(argv, "qsub")
    script_path = operands[0] if operands else None
    script = open(script_path, encoding="utf-8").read() if script_path else sys.stdin.read()
    given = dict((k, v) for k, v in options)
    prefix = given.get("C", "#PBS")
    if prefix:
        # qsub obeys directives before the first command (a small subset here).
        for line in script.splitlines()[1:]:
            if not line.startswith("#"):
                break
            if line.startswith(prefix + " "):
                more, _ = parse_options(line[len(prefix) + 1 :].split(), "qsub")
                for key, value in more:
                    given.setdefault(key, value)
    name = given.get("N", os.path.basename(script_path) if script_path else "STDIN")
    if not re.match(r"[A-Za-z0-9][!-~]*\Z", name) or len(name) > 236:
        fail("qsub: illegal -N value", 2)
    queue = given.get("q", QUEUES[FAMILY][0])
    if queue not in QUEUES[FAMILY]:
        fail(f"qsub: Unknown queue  MSG=cannot locate queue {queue}", 170)
    res = resources([v for k, v in options if k == "l"])
    if FAMILY == "openpbs" and "nodes" in res:
        fail("qsub: Job has resources not supported (nodes)", 2)
    array = given.get("J") if FAMILY == "openpbs" else given.get("t")
    indices: List[int] = []
    if array:
        match = re.match(r"(\d+)-(\d+)(?::(\d+))?\Z", array) if FAMILY == "openpbs" else None
        if FAMILY == "openpbs":
            if not match:
                fail("qsub: illegal -J value", 2)
            indices = list(range(int(match.group(1)), int(match.group(2)) + 1, int(match.group(3) or 1)))
        else:
            spec = array.split("%")[0]
            for part in spec.split(","):
                low, _, high = part.partition("-")
                indices += list(range(int(low), int(high or low) + 1))
    cwd = os.getcwd()

    def path_of(letter: str, suffix: str, seq: int) -> str:
        value = given.get(letter)
        if value is None:
            return os.path.join(cwd, f"{name}.{suffix}{seq}")
        host, sep, rest = value.partition(":")
        return rest if sep and "/" not in host else value

    env = {k: os.environ[k] for k in ("HOME", "PATH", "LANG", "USER", "LOGNAME") if k in os.environ}
    with server() as (root, state):
        seq = state["next"]
        state["next"] += 1
        base = dict(
            seq=seq, name=name, owner=f"{user()}@{os.uname().nodename}", user=user(), queue=queue,
            ctime=time.time(), queued_since=time.time(), procs=procs_of(res), res=res,
            walltime=walltime_seconds(res.get("walltime")), keep=given.get("k", "n"),
            join=given.get("j", "n"), shell=given.get("S", "/bin/bash"), account=given.get("A"),
            workdir=cwd, env=env, begin=parse_begin(given.get("a")),
        )
        base["stdout"] = path_of("o", "o", seq)
        base["stderr"] = base["stdout"] if base["join"] == "oe" else path_of("e", "e", seq)
        with open(os.path.join(root, "jobs", f"{seq}.sh"), "w", encoding="utf-8") as f:
            f.write(script)
        first = "H" if "h" in given else ("W" if base["begin"] else "Q")
        if indices:
            parent_id = f"{seq}[].{SERVER}"
            children = []
            for index in indices:
                child_id = f"{seq}[{index}].{SERVER}"
                child = dict(base, id=child_id, index=index, parent=parent_id, state=first, request=array,
                             seq=f"{seq}-{index}", name=name if FAMILY == "openpbs" else f"{name}-{index}")
                shutil.copyfile(os.path.join(root, "jobs", f"{seq}.sh"),
                                os.path.join(root, "jobs", f"{seq}-{index}.sh"))
                child["stdout"] = child["stdout"].replace("^array_index^", str(index))
                child["stderr"] = child["stderr"].replace("^array_index^", str(index))
                state["jobs"][child_id] = child
                children.append(child_id)
            state["jobs"][parent_id] = dict(base, id=parent_id, array=array, children=children, state=first)
            job_id = parent_id
        else:
            job_id = f"{seq}.{SERVER}"
            state["jobs"][job_id] = dict(base, id=job_id, state=first)
        trace(root, state["jobs"][job_id], "S",
              f"Job Queued at request of {base['owner']}, owner = {base['owner']}, job name = {name}, queue = {queue}")
    print(job_id)


def parse_begin(text: Optional[str]) -> Optional[float]:
    if not text:
        return None
    match = re.match(r"(\d{4})(\d{2})(\d{2})(\d{2})(\d{2})(?:\.(\d{2}))?\Z", text)
    if not match:
        fail("qsub: illegal -a value", 2)
    y, mo, d, h, mi, s = (int(g or 0) for g in match.groups())
    return time.mktime((y, mo, d, h, mi, s, 0, 0, -1))


def user() -> str:
    return os.environ.get("FAKE_PBS_USER") or os.environ.get("USER") or "nobody"


# ------------------------------------------------------------------------------ job commands


def find(state: dict, job_id: str, command: str, history: bool = True) -> dict:
    seq_part = job_id.split("@")[0]
    for key, job in state["jobs"].items():
        if key == seq_part or key.split(".")[0] == seq_part.split(".")[0]:
            if not history and job["state"] in ("F", "X") and FAMILY == "openpbs":
                break
            return job
    if FAMILY == "torque":
        fail(f"{command}: Unknown Job Id Error {job_id}", 153)
    fail(f"{command}: Unknown Job Id {job_id}", 153)


def members(state: dict, job: dict) -> List[dict]:
    return [state["jobs"][c] for c in job["children"]] if job.get("array") else [job]


def signal_job(root: str, job: dict, signum: int) -> None:
    pgid_path = os.path.join(root, "jobs", f"{job['seq']}.pgid")
    for _ in range(50):
        if os.path.exists(pgid_path):
            break
        time.sleep(0.02)
    try:
        with open(pgid_path) as f:
            os.killpg(int(f.read()), signum)
    except (OSError, ValueError):
        pass


def qdel(argv: List[str]) -> None:
    with server() as (root, state):
        for job_id in argv:
            job = find(state, job_id, "qdel", history=False)
            for member in members(state, job):
                if member["state"] in ("Q", "H", "W"):
                    member.update(state=FINAL if not member.get("parent") or FAMILY == "torque" else "X",
                                  cancelled=True, end=time.time())
                    trace(root, member, "S", f"Job deleted at request of {member['owner']}")
                    trace(root, member, "A", f"requestor={member['owner']}")
                elif member["state"] in ("R", "S"):
                    member["cancelled"] = True
                    signal_job(root, member, signal.SIGCONT)
                    signal_job(root, member, signal.SIGTERM)


def qhold(argv: List[str], release: bool = False) -> None:
    command = "qrls" if release else "qhold"
    with server() as (root, state):
        for job_id in argv:
            job = find(state, job_id, command, history=False)
            for member in members(state, job):
                if release and member["state"] == "H":
                    member.update(state="Q", queued_since=time.time())
                elif not release and member["state"] in ("Q", "W"):
                    member["state"] = "H"
                elif member["state"] in ("R", "S", "E"):
                    fail(f"{command}: Request invalid for state of job {job_id}", 168)


def qsig(argv: List[str]) -> None:
    operands = list(argv)
    name = "SIGTERM"
    if operands and operands[0].startswith("-s"):
        name = operands[0][2:] or operands[1]
        operands = operands[1:] if operands[0][2:] else operands[2:]
    with server() as (root, state):
        for job_id in operands:
            job = find(state, job_id, "qsig", history=False)
            if name in ("suspend", "resume") and os.environ.get("FAKE_PBS_PRIVILEGED") != "1":
                fail(f"qsig: Unauthorized Request  {job_id}", 159)
            for member in members(state, job):
                if member["state"] not in ("R", "S"):
                    fail(f"qsig: Request invalid for state of job {job_id}", 168)
                if name == "suspend":
                    signal_job(root, member, signal.SIGSTOP)
                    member["state"] = "S"
                elif name == "resume":
                    signal_job(root, member, signal.SIGCONT)
                    member["state"] = "R"
                else:
                    number = getattr(signal, name if name.startswith("SIG") else "SIG" + name, None)
                    signal_job(root, member, int(name) if name.isdigit() else int(number or 15))


def qmove(argv: List[str]) -> None:
    if len(argv) < 2:
        fail("usage: qmove destination job_identifier...", 2)
    destination, job_ids = argv[0], argv[1:]
    with server() as (root, state):
        for job_id in job_ids:
            job = find(state, job_id, "qmove", history=False)
            if destination not in QUEUES[FAMILY]:
                fail(f"qmove: Unknown queue  {job_id}", 170)
            for member in members(state, job):
                if member["state"] not in ("Q", "H", "W"):
                    fail(f"qmove: Request invalid for state of job {job_id}", 168)
            for member in members(state, job) + ([job] if job.get("array") else []):
                member["queue"] = destination


def tracejob(argv: List[str]) -> None:
    job_id = [a for a in argv if not a.startswith("-") and not a.isdigit()][-1]
    root = state_dir()
    seq = re.sub(r"\[(\d+)\]", r"-\1", job_id.split(".")[0]).replace("[]", "")
    path = os.path.join(root, "jobs", f"{seq}.trace")
    if not os.path.exists(path):
        print(f"tracejob: Couldn't find Job Id {job_id} in logs of past 2 days")
        return
    print(f"\nJob: {job_id}\n")
    with open(path, encoding="utf-8") as f:
        sys.stdout.write(f.read())


def pbsdsh(argv: List[str]) -> None:
    copies = None
    while argv and argv[0].startswith("-") and argv[0] != "--":
        if argv[0] == "-c":
            copies = int(argv[1])
            argv = argv[2:]
        else:
            argv = argv[1:]
    if argv and argv[0] == "--":
        argv = argv[1:]
    if copies is None:
        with open(os.environ["PBS_NODEFILE"]) as f:
            copies = sum(1 for line in f if line.strip())
    children = []
    for rank in range(copies):
        env = dict(os.environ, PBS_TASKNUM=str(rank + 1), PBS_VNODENUM=str(rank))
        children.append(subprocess.Popen(argv, env=env))
    codes = [child.wait() for child in children]
    sys.exit(next((c for c in codes if c), 0))


# ------------------------------------------------------------------------------ listings


def ctime(value: Optional[float]) -> str:
    return time.strftime("%a %b %e %H:%M:%S %Y", time.localtime(value)) if value else ""


def json_value(value) -> str:
    """A value as OpenPBS's own writer prints it: unquoted when strtod reads all of it
    (and it has no leading zero), quoted otherwise."""
    text = str(value)
    stripped = text.strip()
    try:
        number = float(stripped)
        numeric = bool(stripped) and (not stripped.startswith("0") or number < 1)
    except ValueError:
        numeric = False
    if numeric:
        return text
    escaped = text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").replace("\t", "\\t")
    return '"' + escaped + '"'


def write_json(lines: List[str], obj: dict, indent: int) -> None:
    items = list(obj.items())
    for n, (key, value) in enumerate(items):
        comma = "," if n < len(items) - 1 else ""
        pad = " " * indent
        if isinstance(value, dict):
            lines.append(f'{pad}"{key}":{{')
            write_json(lines, value, indent + 4)
            lines.append(f"{pad}}}{comma}")
        elif isinstance(value, list):
            lines.append(f'{pad}"{key}":[')
            for m, item in enumerate(value):
                lines.append(f"{pad}    {json_value(item)}" + ("," if m < len(value) - 1 else ""))
            lines.append(f"{pad}]{comma}")
        else:
            lines.append(f'{pad}"{key}":{json_value(value)}{comma}')


def print_json(section: Optional[str], body: dict) -> None:
    document = {"timestamp": int(time.time()), "pbs_version": VERSION["openpbs"], "pbs_server": SERVER}
    if section and body:
        document[section] = body
    lines = ["{"]
    write_json(lines, document, 4)
    lines.append("}")
    print("\n".join(lines))


def job_attributes(job: dict) -> dict:
    attributes = {"Job_Name": job["name"], "Job_Owner": job["owner"]}
    if job.get("start") and not job.get("array"):
        end = job.get("end") or time.time()
        attributes["resources_used"] = {"walltime": hms(end - job["start"]), "ncpus": job["procs"]}
    attributes.update(job_state=job["state"], queue=job["queue"], server=SERVER)
    if job.get("account"):
        attributes["Account_Name"] = job["account"]
    attributes["ctime"] = ctime(job["ctime"])
    attributes["Error_Path"] = f"{os.uname().nodename}:{job['stderr']}"
    if job.get("exec_host") and job["state"] not in ("Q", "H", "W"):
        attributes["exec_host"] = job["exec_host"]
    attributes["Hold_Types"] = "u" if job["state"] == "H" else "n"
    attributes["Join_Path"] = job["join"]
    attributes["Keep_Files"] = job["keep"]
    attributes["Output_Path"] = f"{os.uname().nodename}:{job['stdout']}"
    attributes["Priority"] = 0
    if job.get("comment"):
        attributes["comment"] = job["comment"]
    resource_list = {"ncpus": job["procs"], "nodect": 1}
    resource_list.update({k: v for k, v in job["res"].items() if k in ("select", "place", "walltime", "mem")})
    attributes["Resource_List"] = resource_list
    if job.get("start"):
        attributes["stime"] = ctime(job["start"])
    if job.get("end"):
        attributes["obittime"] = ctime(job["end"])
    attributes["substate"] = {"Q": 10, "H": 20, "W": 30, "R": 42, "S": 43, "B": 7}.get(
        job["state"], 91 if job.get("cancelled") else 92)
    attributes["Variable_List"] = {"PBS_O_HOME": job["env"].get("HOME", ""), "PBS_O_WORKDIR": job["workdir"],
                                   "PBS_O_QUEUE": job["queue"]}
    if job.get("exit") is not None:
        attributes["Exit_status"] = job["exit"]
    if job.get("array"):
        attributes["array"] = "True"
        attributes["array_indices_submitted"] = job["array"]
    if job.get("parent"):
        attributes["array_id"] = job["parent"]
        attributes["array_index"] = job["index"]
    attributes["project"] = "_pbs_project_default"
    return attributes


def xml_text(value) -> str:
    return str(value).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def torque_job_xml(job: dict) -> str:
    parts = [f"<Job_Id>{xml_text(job['id'])}</Job_Id>", f"<Job_Name>{xml_text(job['name'])}</Job_Name>",
             f"<Job_Owner>{xml_text(job['owner'])}</Job_Owner>"]
    if job.get("start"):
        end = job.get("end") or time.time()
        parts.append(f"<resources_used><walltime>{hms(end - job['start'])}</walltime></resources_used>")
    parts.append(f"<job_state>{job['state']}</job_state><queue>{job['queue']}</queue><server>{SERVER}</server>")
    parts.append(f"<ctime>{int(job['ctime'])}</ctime>")
    parts.append(f"<Error_Path>{xml_text(os.uname().nodename + ':' + job['stderr'])}</Error_Path>")
    if job.get("exec_host") and job["state"] not in ("Q", "H", "W"):
        parts.append(f"<exec_host>{job['exec_host']}</exec_host>")
    parts.append(f"<Hold_Types>{'u' if job['state'] == 'H' else 'n'}</Hold_Types><Join_Path>{job['join']}</Join_Path>")
    parts.append(f"<Output_Path>{xml_text(os.uname().nodename + ':' + job['stdout'])}</Output_Path>")
    nodes = job["res"].get("nodes", "1")
    walltime = f"<walltime>{job['res']['walltime']}</walltime>" if "walltime" in job["res"] else ""
    parts.append(f"<Resource_List><nodect>1</nodect><nodes>{xml_text(nodes)}</nodes>{walltime}</Resource_List>")
    parts.append(f"<euser>{xml_text(job['user'])}</euser>")
    parts.append(f"<Variable_List>PBS_O_WORKDIR={xml_text(job['workdir'])},PBS_O_QUEUE={job['queue']}</Variable_List>")
    if job.get("exit") is not None:
        parts.append(f"<exit_status>{job['exit']}</exit_status>")
    if job.get("start"):
        parts.append(f"<start_time>{int(job['start'])}</start_time>")
    if job.get("end"):
        parts.append(f"<comp_time>{int(job['end'])}</comp_time>")
    if job.get("parent"):
        parts.append(f"<job_array_id>{job['index']}</job_array_id><job_array_request>{job['request']}</job_array_request>")
    return "<Job>" + "".join(parts) + "</Job>"


def qstat(argv: List[str]) -> None:
    if argv == ["--version"]:
        if FAMILY == "openpbs":
            print(f"pbs_version = {VERSION['openpbs']}")
        else:
            sys.stderr.write(f"Version: {VERSION['torque']}\nCommit: 0123456789abcdef\n")
        return
    options, operands = parse_qstat_options(argv)
    if "Q" in options:
        return print_queues(options)
    if "B" in options:
        return print_server(options)
    if "f" not in options:
        fail("fake qstat: only the long formats (-f) are provided", 2)
    with server() as (_root, state):
        jobs = list(state["jobs"].values())
        if operands:
            jobs = [find(state, operand, "qstat", history="x" in options or FAMILY == "torque") for operand in operands]
            if FAMILY == "openpbs" and "x" not in options and any(j["state"] in ("F", "X") for j in jobs):
                fail(f"qstat: {operands[0]} Job has finished, use -x or -H to obtain historical job information", 35)
        elif FAMILY == "openpbs" and "x" not in options:
            jobs = [j for j in jobs if j["state"] != "F"]
        if "t" not in options:
            jobs = [j for j in jobs if not j.get("parent")]
        elif FAMILY == "torque":
            jobs = [j for j in jobs if not j.get("array")]
    if FAMILY == "openpbs":
        print_json("Jobs", {job["id"]: job_attributes(job) for job in jobs})
    else:
        print('<?xml version="1.0"?>')
        print("<Data>" + "".join(torque_job_xml(job) for job in jobs) + "</Data>")


def parse_qstat_options(argv: List[str]):
    options: Dict[str, Optional[str]] = {}
    operands: List[str] = []
    i = 0
    while i < len(argv):
        element = argv[i]
        if element.startswith("-") and len(element) > 1:
            for j, letter in enumerate(element[1:], 1):
                if letter == "F":
                    value = element[j + 1 :] or argv[i + 1]
                    if not element[j + 1 :]:
                        i += 1
                    if FAMILY == "torque":
                        fail("qstat: invalid option -- 'F'", 2)
                    options["F"] = value
                    break
                if letter not in "fxtQB1u":
                    fail(f"qstat: invalid option -- '{letter}'", 2)
                options[letter] = None
        else:
            operands.append(element)
        i += 1
    return options, operands


def qmgr(argv: List[str]) -> None:
    """``qmgr -c "set queue NAME ATTRIBUTE = VALUE"``: the queue settings the listing shows."""
    if len(argv) != 2 or argv[0] != "-c":
        fail("usage: qmgr -c 'set queue NAME ATTRIBUTE = VALUE'")
    match = re.match(r"\s*s(?:et)?\s+q(?:ueue)?\s+(\S+)\s+(resources_max\.walltime|enabled|started)\s*=\s*(\S+)\s*$",
                     argv[1])
    if not match:
        fail(f"qmgr: Illegal attribute or resource value for {argv[1]!r}", 1)
    name, attribute, value = match.groups()
    if name not in QUEUES[FAMILY]:
        fail(f"qmgr obj={name} svr=default: Unknown queue", 1)
    with server() as (_root, state):
        state.setdefault("queue_settings", {}).setdefault(name, {})[attribute] = value


def print_queues(options) -> None:
    with server() as (_root, state):
        counts = {q: {"Queued": 0, "Held": 0, "Running": 0} for q in QUEUES[FAMILY]}
        for job in state["jobs"].values():
            bucket = {"Q": "Queued", "H": "Held", "R": "Running", "S": "Running"}.get(job["state"])
            if bucket and job["queue"] in counts and not job.get("array"):
                counts[job["queue"]][bucket] += 1
        settings = state.get("queue_settings", {})
    limits = {QUEUES[FAMILY][0]: "24:00:00", QUEUES[FAMILY][1]: "168:00:00"}
    limits.update({name: s["resources_max.walltime"] for name, s in settings.items() if "resources_max.walltime" in s})
    enabled = {name: s.get("enabled", "True") for name, s in settings.items()}
    if FAMILY == "openpbs":
        body = {}
        for name in QUEUES["openpbs"]:
            c = counts[name]
            body[name] = {
                "queue_type": "Execution",
                "total_jobs": sum(c.values()),
                "state_count": f"Transit:0 Queued:{c['Queued']} Held:{c['Held']} Waiting:0 Running:{c['Running']} Exiting:0 Begun:0 ",
                "resources_max": {"walltime": limits[name]},
                "enabled": enabled.get(name, "True"),
                "started": "True",
            }
        print_json("Queue", body)
        return
    for name in QUEUES["torque"]:
        c = counts[name]
        print(f"Queue: {name}\n    queue_type = Execution\n    total_jobs = {sum(c.values())}\n"
              f"    state_count = Transit:0 Queued:{c['Queued']} Held:{c['Held']} Waiting:0 Running:{c['Running']} Exiting:0 Complete:0 \n"
              f"    resources_max.walltime = {limits[name]}\n    enabled = {enabled.get(name, 'True')}\n"
              "    started = True\n")


def print_server(options) -> None:
    default = QUEUES[FAMILY][0]
    if FAMILY == "openpbs" and options.get("F") == "json":
        print_json("Server", {SERVER: {"server_state": "Active", "default_queue": default,
                                       "pbs_version": VERSION["openpbs"], "job_history_enable": "True"}})
        return
    extra = "    job_history_enable = True\n" if FAMILY == "openpbs" else "    keep_completed = 300\n    mom_job_sync = True\n"
    print(f"Server: {SERVER}\n    server_state = Active\n    default_queue = {default}\n{extra}"
          f"    pbs_version = {VERSION[FAMILY]}\n")


def pbsnodes(argv: List[str]) -> None:
    if FAMILY == "openpbs" and argv[:1] != ["-a"]:
        fail("fake pbsnodes: use -a -F json", 2)
    if FAMILY == "torque" and argv != ["-x"]:
        fail("fake pbsnodes: use -x", 2)
    with server() as (_root, state):
        used = {name: [] for name, _ in NODES}
        for job in state["jobs"].values():
            if job["state"] in ("R", "S", "E") and job.get("exec_host"):
                for entry in job["exec_host"].split("+"):
                    host, _, slots = entry.partition("/")
                    count = int(slots.split("*")[1]) if "*" in slots else (
                        int(slots.split("-")[1]) + 1 if "-" in slots else 1)
                    used.setdefault(host, []).extend([job["id"]] * count)
    if FAMILY == "openpbs":
        body = {}
        for name, cpus in NODES:
            jobs = used[name]
            body[name] = {
                "Mom": name, "Port": 15002, "ntype": "PBS",
                "state": "job-busy" if len(jobs) >= cpus else "free",
                "pcpus": cpus,
                "jobs": [f"{j}/{i}" for i, j in enumerate(jobs)],
                "resources_available": {"arch": "linux", "host": name, "mem": "8gb", "ncpus": cpus},
                "resources_assigned": {"ncpus": len(jobs)},
            }
            if not jobs:
                del body[name]["jobs"]
        print_json("nodes", body)
        return
    out = []
    for name, cpus in NODES:
        jobs = used[name]
        job_text = ",".join(f"{i}/{j}" for i, j in enumerate(jobs))
        state_text = "job-exclusive" if len(jobs) >= cpus else "free"
        out.append(f"<Node><name>{name}</name><state>{state_text}</state><np>{cpus}</np><ntype>cluster</ntype>"
                   + (f"<jobs>{job_text}</jobs>" if jobs else "")
                   + f"<status>state=free,loadave=0.00,ncpus={cpus},physmem=8388608kb,opsys=linux</status></Node>")
    print('<?xml version="1.0"?>\n<Data>' + "".join(out) + "</Data>")


COMMANDS = {
    "qstat": qstat, "qsub": qsub, "qdel": qdel, "qhold": qhold,
    "qrls": lambda argv: qhold(argv, release=True), "qsig": qsig, "qmove": qmove,
    "pbsnodes": pbsnodes, "tracejob": tracejob, "pbsdsh": pbsdsh, "qmgr": qmgr,
}


def main(command: str, argv: List[str]) -> None:
    if command == "_run":
        run_job(argv[0], argv[1])
        return
    if FAMILY not in VERSION:
        fail(f"fake PBS: FAKE_PBS_FAMILY must be openpbs or torque, not {FAMILY!r}")
    if command not in ("qstat", "pbsdsh", "qmgr") and argv == ["--version"]:
        if FAMILY == "openpbs":
            print(f"pbs_version = {VERSION['openpbs']}")
        else:
            sys.stderr.write(f"version: {VERSION['torque']}\n")
        return
    COMMANDS[command](argv)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
