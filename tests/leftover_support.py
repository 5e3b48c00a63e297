"""What a test run leaves behind, found and removed at its end.

A run keeps everything it makes in one area of its own, ``<temp>/pa-tests-XXXXXXXX``
(:class:`RunArea`): pytest's ``tmp_path`` directories, ``TMPDIR`` for the run and for every
process it starts, the state directory and home of every agent the tests spawn
(``agent_fixtures.subprocess_env``).  What the run starts is marked, so that it can be told
from what others run on the same machine and clusters at the same time:

* processes: by an environment variable, ``PROXY_AGENT_TEST_RUN=<area>``, which every child
  inherits (and SLURM passes on to a job's processes);
* SLURM jobs: by their WCKey (``SBATCH_WCKEY``, which sbatch reads from the environment);
* Grid Engine jobs: by the submitter's ``PATH`` that Grid Engine records with each job
  (``sge_o_path``), which starts with ``<area>/bin``;
* processes over ssh (which passes no environment on): the ssh tests hold the test accounts
  while they run and check them themselves (``ssh_support.accounts_of_our_own``), then
  :func:`note` what they found.

At the end of the run, processes still running, jobs still in a scheduler and an area that
cannot be removed are *leftovers*: they are listed, the run fails, and they are removed.
"""

from __future__ import annotations

import math
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import xml.etree.ElementTree as ElementTree
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

import attrs

RUN_VARIABLE = "PROXY_AGENT_TEST_RUN"
TEST_VARIABLE = "PROXY_AGENT_TEST_NODEID"
#: How long (unscaled) the run's processes have to end by themselves once the tests are done.
#: A local job keeper would stay keeper.IDLE_EXIT seconds after an agent that left without a word:
#: once nothing else of the run is left, it is told that no agent comes back (release_idle_keepers).
PROCESS_GRACE = 20


@attrs.frozen
class RunArea:
    root: Path

    @classmethod
    def create(cls) -> "RunArea":
        root = Path(tempfile.mkdtemp(prefix="pa-tests-", dir=tempfile.gettempdir()))
        for name in ("tmp", "agents", "home", "bin"):
            (root / name).mkdir()
        return cls(root)

    @property
    def tag(self) -> str:
        """A short name for the run (the area's random part), for SLURM's WCKey."""
        return self.root.name

    @property
    def tmp(self) -> Path:
        return self.root / "tmp"

    @property
    def agents(self) -> Path:
        """Parent of the agents' state directories."""
        return self.root / "agents"

    @property
    def home(self) -> Path:
        """HOME for the agents the tests spawn (their output spools, token files...)."""
        return self.root / "home"

    @property
    def path_marker(self) -> str:
        """An empty directory at the head of PATH: Grid Engine keeps the submitter's PATH."""
        return str(self.root / "bin")

    def environment(self) -> Dict[str, str]:
        """What the run puts into its own environment (and so into every child's)."""
        path = os.environ.get("PATH", os.defpath)
        return {
            RUN_VARIABLE: str(self.root),
            "TMPDIR": str(self.tmp),
            "SBATCH_WCKEY": self.tag,
            "PATH": self.path_marker + os.pathsep + path,
        }


# ---------------------------------------------------------------------------- processes


@attrs.frozen
class Leftover:
    kind: str  # "process", "SLURM job", "Grid Engine job", "directory"
    ident: str
    detail: str

    def line(self) -> str:
        return f"{self.kind} {self.ident}: {self.detail}"


_noted: List[Leftover] = []


def note(leftover: Leftover) -> None:
    """Report something the run left behind that a fixture found (and removed) itself."""
    _noted.append(leftover)


def noted() -> List[Leftover]:
    return list(_noted)


def _environ(pid: int) -> Dict[str, str]:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    out = {}
    for item in raw.split(b"\0"):
        key, sep, value = item.partition(b"=")
        if sep:
            out[key.decode("utf-8", "replace")] = value.decode("utf-8", "replace")
    return out


def _command_line(pid: int) -> str:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return "?"
    return " ".join(part.decode("utf-8", "replace") for part in raw.split(b"\0") if part)[:300]


#: The test clusters' own daemons.  A test that restarts one (a Grid Engine master, say) starts
#: it with the run's mark; it is the cluster's, shared by everyone, and is never the run's
#: leftover (nor ended by it).
CLUSTER_DAEMONS = frozenset({"sge_qmaster", "sge_execd", "sge_shepherd", "slurmctld", "slurmd", "slurmstepd",
                             "slurmscriptd", "munged", "sshd"})


def _owner_and_name(pid: int):
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None, None
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    return int(fields.get("Uid", "-1").split()[0]), fields.get("Name", "").strip()


def marked_processes(area: RunArea) -> Dict[int, Leftover]:
    """Live processes of this user (not this one, nor a cluster daemon) that carry the run's mark."""
    found = {}
    own = os.getpid()
    uid = os.getuid()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == own:
            continue
        pid = int(entry)
        owner, name = _owner_and_name(pid)
        if owner != uid or name in CLUSTER_DAEMONS:
            continue
        env = _environ(pid)
        if env.get(RUN_VARIABLE) != str(area.root):
            continue
        test = env.get(TEST_VARIABLE, "outside any test")
        found[pid] = Leftover("process", str(pid), f"{_command_line(pid)} (started by {test})")
    return found


def _parent(pid: int) -> Optional[int]:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[1])


def _keeper_directory(pid: int) -> Optional[str]:
    """The state directory of a local job keeper (``python -m proxy_agent.schedulers.keeper DIR``)."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode("utf-8", "replace").split("\0")
    except OSError:
        return None
    if "proxy_agent.schedulers.keeper" in argv:
        rest = argv[argv.index("proxy_agent.schedulers.keeper") + 1:]
        return rest[0] if rest and rest[0] else None
    return None


def release_idle_keepers(pids) -> None:
    """Tell each idle local job keeper among ``pids`` (one with no job process left) what an
    agent tells it when it leaves for good ("bye"), so that it ends now rather than after
    waiting keeper.IDLE_EXIT seconds for an agent to come back."""
    pids = set(pids)
    parents = {_parent(int(p)) for p in os.listdir("/proc") if p.isdigit()}
    for pid in pids:
        directory = _keeper_directory(pid)
        if directory is None or pid in parents:
            continue
        try:
            with socket.socket(socket.AF_UNIX) as conn:
                conn.settimeout(5)
                conn.connect(os.path.join(directory, "keeper.sock"))
                conn.sendall(b'{"op": "bye", "policy": "keep"}\n')
                while conn.recv(4096):  # it closes the connection once it has taken the bye
                    pass
        except OSError:
            pass


def wait_for_processes(area: RunArea, grace: float) -> List[Leftover]:
    """The run's processes still alive after ``grace`` seconds (they may be on their way out);
    once only idle job keepers are left, they are told to leave."""
    return list(wait_for_ends(lambda: marked_processes(area), grace).values())


def wait_for_ends(alive: Callable[[], Dict[int, Any]], grace: float) -> Dict[int, Any]:
    """What ``alive()`` still finds after ``grace`` seconds.  Once only job keepers are left,
    they are told (again every second: one may be taking in an agent's end meanwhile) that no
    agent is coming back."""
    deadline = time.monotonic() + grace
    released = -math.inf
    while True:
        left = alive()
        if not left or time.monotonic() >= deadline:
            return left
        if time.monotonic() - released >= 1 and all(_keeper_directory(pid) for pid in left):
            release_idle_keepers(left)
            released = time.monotonic()
        time.sleep(0.2)


def kill_processes(leftovers: List[Leftover]) -> None:
    for leftover in leftovers:
        try:
            os.kill(int(leftover.ident), signal.SIGKILL)
        except (ProcessLookupError, PermissionError, ValueError):
            pass


# ---------------------------------------------------------------------------- scheduler jobs

_SLURM_ENDED = {"COMPLETED", "CANCELLED", "FAILED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "BOOT_FAIL",
                "DEADLINE", "OUT_OF_MEMORY", "REVOKED", "SPECIAL_EXIT"}


def _run(argv: List[str], env: Optional[dict] = None, timeout: float = 60) -> Optional[subprocess.CompletedProcess]:
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired):
        return None


def slurm_jobs(area: RunArea) -> List[Leftover]:
    """SLURM jobs of the run (its WCKey) that are not over."""
    if not os.path.isfile(os.environ.get("SLURM_CONF", "")) or shutil.which("squeue") is None:
        return []
    result = _run(["squeue", "--noheader", "--states=all", "--format=%i|%T|%u|%j|%w"])
    if result is None or result.returncode != 0:
        return []
    found = []
    for line in result.stdout.splitlines():
        if line.count("|") < 4:
            continue
        number, state, user, *name, wckey = line.split("|")
        if wckey.strip() != area.tag or state in _SLURM_ENDED:
            continue
        found.append(Leftover("SLURM job", number, f"{state}, user {user}, name {'|'.join(name)!r}"))
    return found


def cancel_slurm_jobs(leftovers: List[Leftover]) -> None:
    if leftovers:
        _run(["scancel", *[j.ident for j in leftovers]])


def _sge_env() -> Optional[dict]:
    root = os.environ.get("SGE_ROOT")
    if not root or shutil.which("qstat") is None:
        return None
    return dict(os.environ, SGE_ROOT=root, SGE_CELL=os.environ.get("SGE_CELL", "default"))


def sge_jobs(area: RunArea) -> List[Leftover]:
    """Grid Engine jobs submitted by the run (the PATH it recorded) that are still in the cell."""
    env = _sge_env()
    if env is None:
        return []
    listing = _run(["qstat", "-u", "*", "-xml"], env=env)
    if listing is None or listing.returncode != 0:
        return []
    try:
        tree = ElementTree.fromstring(listing.stdout)
    except ElementTree.ParseError:
        return []
    jobs: Dict[str, str] = {}
    for job in tree.iter("job_list"):
        number = job.findtext("JB_job_number")
        if number:
            jobs[number] = f"{job.findtext('state')}, user {job.findtext('JB_owner')}, name {job.findtext('JB_name')!r}"
    if not jobs:
        return []
    detail = _run(["qstat", "-j", ",".join(sorted(jobs))], env=env)
    if detail is None:
        return []
    found = []
    # qstat -j prints one block per job, each starting with "job_number:".
    for block in re.split(r"^=+\s*$", detail.stdout, flags=re.M):
        number = re.search(r"^job_number:\s+(\d+)", block, re.M)
        path = re.search(r"^sge_o_path:\s+(\S+)", block, re.M)
        if number and path and path.group(1).split(os.pathsep)[0] == area.path_marker:
            found.append(Leftover("Grid Engine job", number.group(1), jobs.get(number.group(1), "")))
    return found


def delete_sge_jobs(leftovers: List[Leftover]) -> None:
    env = _sge_env()
    if leftovers and env is not None:
        _run(["qdel", "-f", *[j.ident for j in leftovers]], env=env)


# ---------------------------------------------------------------------------- the area


def remove_area(area: RunArea) -> List[Leftover]:
    """Remove the run's area; what cannot be removed is a leftover."""
    shutil.rmtree(area.root, ignore_errors=True)
    if area.root.exists():
        left = sorted(str(p) for p in area.root.rglob("*"))[:10]
        return [Leftover("directory", str(area.root), f"could not be removed; still holds {left}")]
    return []
