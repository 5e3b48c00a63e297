"""The Invoke Server as a grid RPC client meets it: ``python -m proxy_agent.invoke`` over real
pipes, its jobs real programs run by the agent's local scheduler (each test has a state
directory of its own, where the server starts an agent; it is stopped afterwards).  The last
section drives the server loop against a scripted job gateway, for orders of events real
processes cannot be made to produce."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Set, Tuple

import trio
import trio.testing

from agent_fixtures import subprocess_env
from wait_support import scaled
from proxy_agent.frontends.invoke.protocol import CreateNotify, InvokeStatus, StatusNotify, encode_job_create, parse_notify
from proxy_agent.frontends.invoke.server import InvokeServer, JobUpdate
from proxy_agent.service.jobs import ErrorKind, JobError, JobState, SubmitError

from test_invoke_protocol import FACTS_NOTIFIES, FACTS_REPLIES

TIMEOUT = scaled(30)


class InvokeClient:
    """The client's end of the three pipes, keeping everything the server wrote."""

    def __init__(self, proc: trio.Process) -> None:
        self.proc = proc
        self.out = bytearray()  # all of stdout
        self.err = bytearray()  # all of stderr
        self._out_pos = 0
        self._err_pos = 0
        self._notifies: List[str] = []
        self._taken: List[bool] = []
        #: how long one line may take to come
        self.timeout = TIMEOUT

    async def send(self, data: bytes) -> None:
        await self.proc.stdin.send_all(data)

    async def close_requests(self) -> None:
        await self.proc.stdin.aclose()

    async def _line(self, stream, buffer: bytearray, pos_name: str) -> Optional[str]:
        with trio.fail_after(self.timeout):
            while True:
                pos = getattr(self, pos_name)
                end = buffer.find(b"\r\n", pos)
                if end >= 0:
                    line = bytes(buffer[pos:end])
                    assert b"\n" not in line and b"\r" not in line, f"bare line end in {line!r}"
                    setattr(self, pos_name, end + 2)
                    return line.decode()
                data = await stream.receive_some(65536)
                if not data:
                    assert getattr(self, pos_name) == len(buffer), f"unterminated output {bytes(buffer[pos:])!r}"
                    return None
                buffer += data

    async def reply(self) -> Optional[str]:
        """The next reply line (None at end of file)."""
        return await self._line(self.proc.stdout, self.out, "_out_pos")

    async def find_notify(self, predicate) -> Optional[str]:
        """The first notify line not taken yet that ``predicate`` accepts, in arrival order
        (None at end of file).  Lines passed over stay for later calls."""
        for index, line in enumerate(self._notifies):
            if not self._taken[index] and predicate(line):
                self._taken[index] = True
                return line
        while True:
            line = await self._line(self.proc.stderr, self.err, "_err_pos")
            if line is None:
                return None
            self._notifies.append(line)
            accepted = predicate(line)
            self._taken.append(accepted)
            if accepted:
                return line

    async def notify(self) -> Optional[str]:
        """The next notify line not taken yet (None at end of file)."""
        return await self.find_notify(lambda line: True)

    async def notifies_until(self, predicate) -> List[str]:
        """Every notify line not taken yet, up to the first that ``predicate`` accepts."""
        lines = []
        while True:
            line = await self.notify()
            assert line is not None, f"notify pipe ended; got {lines}"
            lines.append(line)
            if predicate(line):
                return lines

    async def final_status(self, job_id: str) -> StatusNotify:
        line = await self.find_notify(lambda l: l.startswith(f"STATUS_NOTIFY {job_id} ") and _final(l))
        assert line is not None, f"no final status for {job_id}"
        return parse_notify(line)

    async def create(self, request_id: int, attributes) -> str:
        """JOB_CREATE; returns the reply line (not waiting for the notify)."""
        await self.send(encode_job_create(request_id, attributes))
        return await self.reply()

    async def created_job(self, request_id: int, attributes) -> str:
        assert await self.create(request_id, attributes) == "S"
        line = await self.find_notify(lambda l: l.startswith(f"CREATE_NOTIFY {request_id} "))
        notify = parse_notify(line)
        assert notify == CreateNotify(str(request_id), True, job_id=notify.job_id), line
        return notify.job_id

    async def drain(self) -> None:
        """Read both pipes to their end (the server has exited)."""
        while await self.reply() is not None:
            pass
        while await self.notify() is not None:
            pass

    async def wait(self) -> int:
        with trio.fail_after(TIMEOUT):
            return await self.proc.wait()


def _final(line: str) -> bool:
    words = line.split(" ")
    return words[0] == "STATUS_NOTIFY" and words[2] in ("DONE", "FAILED")


def finals(notifies: bytes) -> Dict[str, List[str]]:
    """Every final STATUS_NOTIFY written, by job id (the client counts each against its jobs)."""
    found: Dict[str, List[str]] = {}
    for line in notifies.decode().split("\r\n"):
        if line and _final(line):
            found.setdefault(line.split(" ")[1], []).append(line)
    return found


@asynccontextmanager
async def invoke_server(*args: str, env: Optional[Dict[str, str]] = None, cwd: Optional[Path] = None,
                        state_dir: Optional[Path] = None):
    """The server as the client starts it, on a state directory of its own (an agent is
    started there at its first job, and stopped when the block ends)."""
    own_state = state_dir is None
    if state_dir is None:
        state_dir = Path(tempfile.mkdtemp(prefix="invoke-state-"))
    proc = await trio.lowlevel.open_process(
        [sys.executable, "-m", "proxy_agent.invoke", "--state-dir", str(state_dir), *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=subprocess_env(**(env or {})),
        cwd=str(cwd) if cwd else None,
    )
    client = InvokeClient(proc)
    try:
        yield client
    finally:
        if proc.returncode is None:
            proc.kill()
            with trio.CancelScope(shield=True):
                await proc.wait()
        with trio.CancelScope(shield=True):
            await stop_agent(state_dir)
        if own_state:
            shutil.rmtree(state_dir, ignore_errors=True)


def agent_pid(state_dir: Path) -> Optional[int]:
    """The pid of the agent holding a state directory (None: none does)."""
    try:
        about = json.loads((state_dir / "agent.lock").read_text() or "{}")
    except (OSError, ValueError):
        return None
    pid = about.get("pid")
    return pid if isinstance(pid, int) and alive(pid) else None


def processes_of(state_dir: Path) -> List[int]:
    """Pids of the agents and keepers working in a state directory (found by their command
    lines: an agent the server started may still be starting, before it took the lock)."""
    found = []
    prefix = str(state_dir).encode()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                words = f.read().split(b"\0")
        except OSError:
            continue
        if words[1:3] not in ([b"-m", b"proxy_agent"], [b"-m", b"proxy_agent.schedulers.keeper"]):
            continue
        if any(w == prefix or w.startswith(prefix + b"/") for w in words):
            found.append(int(entry))
    return found


async def stop_agent(state_dir: Path) -> None:
    """End the agent of a state directory and its keeper (SIGTERM, then SIGKILL)."""
    # An agent started just before the server ended may not be listed yet.
    with trio.move_on_after(scaled(1.0)):
        while not processes_of(state_dir) and (state_dir / "agent.err").exists():
            await trio.sleep(0.05)
    # ... and one may appear while the others end (a launch forks its service): every
    # process working in the directory is ended, until none has been seen for a moment.
    ended: Set[int] = set()
    quiet_since: Optional[float] = None
    with trio.move_on_after(scaled(30)):
        while True:
            pids = processes_of(state_dir)
            for pid in pids:
                if pid not in ended:
                    ended.add(pid)
                    try:
                        os.kill(pid, signal.SIGTERM)
                    except ProcessLookupError:
                        pass
            if any(alive(p) for p in ended) or pids:
                quiet_since = None
            elif quiet_since is None:
                quiet_since = trio.current_time()
            elif trio.current_time() - quiet_since >= 0.3:
                return
            await trio.sleep(0.05)
    for pid in ended | set(processes_of(state_dir)):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def attributes(program: str, args: Sequence[str], *, workdir: Path, extra=(), out: Optional[Path] = None, err: Optional[Path] = None):
    """A JOB_CREATE's attributes in the order the real client sends them."""
    attrs = list(extra) + [
        ("hostname", "localhost"),
        ("port", "0"),
        ("client_name", "localhost"),
        ("executable_path", program),
        ("backend", "NORMAL"),
        ("count", "1"),
        ("staging", "false"),
    ]
    attrs += [("argument", a) for a in args]
    attrs += [("work_directory", str(workdir)), ("redirect_enable", "true" if out or err else "false")]
    if out:
        attrs.append(("stdout_file", str(out)))
    if err:
        attrs.append(("stderr_file", str(err)))
    attrs += [("status_polling", "0"), ("refresh_credential", "0")]
    return attrs


def script(path: Path, body: str, mode: int = 0o755) -> Path:
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(mode)
    return path


def sleeper(tmp_path: Path, name: str, seconds: int = 600) -> Tuple[List[str], Path]:
    """Arguments of /bin/sh for a job that writes its pid to a file and sleeps."""
    pidfile = tmp_path / f"{name}.pid"
    return ["-c", f'echo $$ > "{pidfile}"; exec sleep {seconds}'], pidfile


async def wait_for_file(path: Path) -> int:
    with trio.fail_after(TIMEOUT):
        while True:
            try:
                text = path.read_text()
            except FileNotFoundError:
                text = ""
            if text.endswith("\n"):
                return int(text)
            await trio.sleep(0.02)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is as good as gone: it runs nothing.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


async def wait_gone(pids: Sequence[int], within: float = scaled(30)) -> None:
    with trio.fail_after(within):
        while any(alive(p) for p in pids):
            await trio.sleep(0.05)


# --------------------------------------------------------------------------- the facts sheet's exchange


async def test_facts_sheet_exchange_byte_for_byte(tmp_path):
    # It runs long enough for the agent to report it running (a shorter one may go from
    # PENDING straight to DONE, which the client accepts too).
    stub = script(tmp_path / "_stub_pi_trial", 'echo "pi trial $3"\necho "to stderr" >&2\nsleep 0.5\n')
    out, err = tmp_path / "ngtmpfile.o9UguW", tmp_path / "ngtmpfile.i7T1TH"
    log = tmp_path / "invoke.log"
    args = [
        "--connectbackAddress=ng_tcp://localhost:57007/",
        "--authNumber=1812930085",
        "--contextID=1",
        "--jobID=1",
        "--heartbeat=60",
        "--connectRetry=4,1,2,random",
        "--tcpNodelay=0",
    ]
    async with invoke_server("-l", str(log)) as client:
        await client.send(b"QUERY_FEATURES\r\n" + encode_job_create(1, attributes(str(stub), args, workdir=tmp_path, out=out, err=err)))
        for _ in range(9):
            await client.reply()
        assert await client.notifies_until(lambda l: _final(l)) == [
            "CREATE_NOTIFY 1 S job-1",
            "STATUS_NOTIFY job-1 PENDING queued",
            "STATUS_NOTIFY job-1 ACTIVE started",
            "STATUS_NOTIFY job-1 DONE exit status 0",
        ]
        # the job has reported its end: the destroy gets S and nothing more
        await client.send(b"JOB_DESTROY job-1\r\n")
        assert await client.reply() == "S"
        await client.send(b"EXIT\r\n")
        assert await client.reply() == "S"
        assert await client.wait() == 0
        await client.drain()
    assert bytes(client.out) == FACTS_REPLIES
    assert bytes(client.err) == FACTS_NOTIFIES
    assert out.read_text() == "pi trial --contextID=1\n"
    assert err.read_text() == "to stderr\n"
    text = log.read_text()
    assert "JOB_CREATE 1 -> job-1" in text and "ended: EXIT" in text


async def test_without_a_log_file_nothing_but_protocol_is_written(tmp_path):
    async with invoke_server(cwd=tmp_path) as client:
        await client.send(b"FROB\r\nhostname x\r\n\xff\xfe\r\nEXIT\r\n")
        assert (await client.reply()).startswith("F unknown request FROB")
        assert await client.reply() == "S"
        assert await client.wait() == 0
        await client.drain()
    assert bytes(client.err) == b""
    assert list(tmp_path.iterdir()) == []


# --------------------------------------------------------------------------- many jobs


async def test_hundred_concurrent_jobs(tmp_path):
    n = 100
    go = tmp_path / "go"  # every job runs until all of them run at once
    async with invoke_server() as client:
        data = b"".join(
            encode_job_create(i, attributes("/bin/sh", ["-c", f"while [ ! -e '{go}' ]; do sleep 0.05; done"],
                                            workdir=tmp_path)) for i in range(1, n + 1)
        )
        await client.send(data)
        for _ in range(n):
            assert await client.reply() == "S"
        created: Dict[str, str] = {}
        active = set()
        done = set()
        while len(done) < n:
            line = await client.notify()
            notify = parse_notify(line)
            if isinstance(notify, CreateNotify):
                assert notify.ok, line
                created[notify.request_id] = notify.job_id
            elif notify.status is InvokeStatus.ACTIVE:
                active.add(notify.job_id)
                if len(active) == n:
                    go.touch()  # all of them run at once: let them end
            elif notify.status.final:
                assert line.endswith("DONE exit status 0"), line
                assert len(active) == n, f"{notify.job_id} ended before every job ran"
                done.add(notify.job_id)
        assert sorted(created) == sorted(str(i) for i in range(1, n + 1))
        assert set(created.values()) == done == active == {f"job-{i}" for i in range(1, n + 1)}
        await client.send(b"EXIT\r\n")
        assert await client.reply() == "S"
        assert await client.wait() == 0


# --------------------------------------------------------------------------- destroy


async def test_destroy_running_job_cancels_it_and_reports_done(tmp_path):
    args, pidfile = sleeper(tmp_path, "a")
    async with invoke_server() as client:
        job = await client.created_job(1, attributes("/bin/sh", args, workdir=tmp_path))
        await client.notifies_until(lambda l: l == f"STATUS_NOTIFY {job} ACTIVE started")
        pid = await wait_for_file(pidfile)
        assert alive(pid)
        await client.send(b"JOB_STATUS job-1\r\n")
        assert await client.reply() == "S ACTIVE"
        await client.send(b"JOB_DESTROY job-1\r\n")
        assert await client.reply() == "S"
        assert await client.notify() == "STATUS_NOTIFY job-1 DONE destroyed"
        assert not alive(pid)
        await client.send(b"JOB_STATUS job-1\r\nJOB_DESTROY job-1\r\nJOB_DESTROY job-7\r\nJOB_STATUS job-7\r\n")
        assert await client.reply() == "S DONE"
        assert await client.reply() == "S"  # destroyed already: nothing more
        assert await client.reply() == "F JOB_DESTROY: no job job-7"
        assert await client.reply() == "F JOB_STATUS: no job job-7"
        await client.send(b"EXIT\r\n")
        assert await client.reply() == "S"
        assert await client.wait() == 0
        await client.drain()
    assert client.err.count(b"job-1 DONE") == 1


async def test_destroy_queued_job(tmp_path):
    first, first_pid = sleeper(tmp_path, "first")
    second, second_pid = sleeper(tmp_path, "second")
    async with invoke_server("--slots", "1") as client:
        job1 = await client.created_job(1, attributes("/bin/sh", first, workdir=tmp_path))
        job2 = await client.created_job(2, attributes("/bin/sh", second, workdir=tmp_path))
        await wait_for_file(first_pid)
        await client.send(f"JOB_STATUS {job2}\r\n".encode())
        assert await client.reply() == "S PENDING"
        await client.send(f"JOB_DESTROY {job2}\r\n".encode())
        assert await client.reply() == "S"
        final = await client.final_status(job2)
        assert (final.status, final.text) == (InvokeStatus.DONE, "destroyed")
        assert not second_pid.exists()
        await client.send(f"JOB_DESTROY {job1}\r\n".encode())
        assert await client.reply() == "S"
        final = await client.final_status(job1)
        assert (final.status, final.text) == (InvokeStatus.DONE, "destroyed")
        await client.send(b"EXIT\r\n")
        assert await client.reply() == "S"
        assert await client.wait() == 0
    assert not second_pid.exists()


async def test_failed_job_reports_failed_once_and_a_destroy_adds_nothing(tmp_path):
    async with invoke_server() as client:
        job = await client.created_job(1, attributes("/bin/sh", ["-c", "exit 3"], workdir=tmp_path))
        lines = await client.notifies_until(_final)
        assert lines[-1] == f"STATUS_NOTIFY {job} FAILED exit status 3"
        await client.send(f"JOB_DESTROY {job}\r\nJOB_DESTROY {job}\r\nEXIT\r\n".encode())
        assert [await client.reply() for _ in range(3)] == ["S", "S", "S"]
        assert await client.wait() == 0
        await client.drain()
    assert finals(client.err) == {job: [f"STATUS_NOTIFY {job} FAILED exit status 3"]}


async def test_fifty_jobs_each_destroyed_after_its_done_get_one_final_notify_each(tmp_path):
    """As the Ninf-G client does with every handle: the call returns (the job's DONE), then
    the handle's job is destroyed.  Each job gets exactly one DONE, ever, and the server keeps
    serving (a second DONE would break the client's count and hang its next handle)."""
    n = 50
    async with invoke_server() as client:
        client.timeout = 60
        await client.send(b"".join(encode_job_create(i, attributes("/bin/true", ["x"], workdir=tmp_path))
                                   for i in range(1, n + 1)))
        assert [await client.reply() for _ in range(n)] == ["S"] * n
        destroyed = set()
        while len(destroyed) < n:
            line = await client.notify()
            assert line is not None
            if _final(line):
                job = line.split(" ")[1]
                assert line == f"STATUS_NOTIFY {job} DONE exit status 0" and job not in destroyed
                await client.send(f"JOB_DESTROY {job}\r\n".encode())
                assert await client.reply() == "S"
                destroyed.add(job)
        # the next handle's job runs as usual
        job = await client.created_job(n + 1, attributes("/bin/true", ["x"], workdir=tmp_path))
        assert (await client.final_status(job)).status is InvokeStatus.DONE
        await client.send(b"EXIT\r\n")
        assert await client.reply() == "S"
        assert await client.wait() == 0
        await client.drain()
    found = finals(client.err)
    assert sorted(found) == sorted(f"job-{i}" for i in range(1, n + 2))
    assert all(len(lines) == 1 for lines in found.values()), {j: l for j, l in found.items() if len(l) > 1}


async def test_destroys_that_race_the_jobs_end_get_one_final_notify_each(tmp_path):
    """JOB_DESTROY sent around the moment each job ends (some before, some after, some while
    the end is being reported): whichever comes first, one final notify per job."""
    n = 30
    async with invoke_server() as client:
        client.timeout = 60
        jobs = []
        for i in range(1, n + 1):
            duration = (i % 6) * 0.02
            jobs.append(await client.created_job(i, attributes("/bin/sh", ["-c", f"sleep {duration}"],
                                                               workdir=tmp_path)))
        # destroys spread over the jobs' ends: each one a little later than the one before
        for index, job in enumerate(jobs):
            await client.send(f"JOB_DESTROY {job}\r\n".encode())
            assert await client.reply() == "S"
            await trio.sleep(0.005 * (index % 7))
        for job in jobs:
            final = await client.final_status(job)
            assert final.status is InvokeStatus.DONE and final.text in ("destroyed", "exit status 0"), final
        await client.send(b"EXIT\r\n")
        assert await client.reply() == "S"
        assert await client.wait() == 0
        await client.drain()
    found = finals(client.err)
    assert sorted(found) == sorted(jobs)
    assert all(len(lines) == 1 for lines in found.values()), {j: l for j, l in found.items() if len(l) > 1}


async def test_the_verbose_log_shows_requests_replies_and_notifies(tmp_path):
    log = tmp_path / "invoke.log"
    async with invoke_server("-l", str(log), "-v") as client:
        await client.send(b"QUERY_FEATURES\r\nJOB_STATUS job-9\r\n")
        await client.reply()  # SM ... REPLY_END
        while await client.reply() != "REPLY_END":
            pass
        assert await client.reply() == "F JOB_STATUS: no job job-9"
        job = await client.created_job(1, attributes("/bin/true", ["x"], workdir=tmp_path))
        await client.final_status(job)
        await client.send(f"JOB_DESTROY {job}\r\nEXIT\r\n".encode())
        assert await client.reply() == "S" and await client.reply() == "S"
        assert await client.wait() == 0
    text = log.read_text()
    for expected in ("request: QueryFeatures", "reply: SM", "reply: REPLY_END", "reply: F JOB_STATUS: no job job-9",
                     "request: JobCreate", "reply: S\n", "notify: CREATE_NOTIFY 1 S job-1",
                     "notify: STATUS_NOTIFY job-1 DONE exit status 0", "request: JobDestroy", "request: Exit"):
        assert expected in text, expected
    assert "\r" not in text


# --------------------------------------------------------------------------- the end


async def test_exit_with_jobs_running_ends_them(tmp_path):
    pidfiles = []
    async with invoke_server() as client:
        for i in range(1, 4):
            args, pidfile = sleeper(tmp_path, f"j{i}")
            pidfiles.append(pidfile)
            await client.created_job(i, attributes("/bin/sh", args, workdir=tmp_path))
        pids = [await wait_for_file(p) for p in pidfiles]
        assert all(alive(p) for p in pids)
        await client.send(b"EXIT\r\n")
        assert await client.reply() == "S"
        assert await client.wait() == 0
        await client.drain()
    await wait_gone(pids)  # (the jobs would sleep 600 s)


async def test_end_of_file_is_client_death(tmp_path):
    args, pidfile = sleeper(tmp_path, "orphan")
    async with invoke_server() as client:
        await client.created_job(1, attributes("/bin/sh", args, workdir=tmp_path))
        pid = await wait_for_file(pidfile)
        # The client dies in the middle of its next JOB_CREATE.
        await client.send(b"JOB_CREATE 2\r\nhostname localhost\r\n")
        await client.close_requests()
        assert await client.reply() == "F JOB_CREATE 2: input ended before JOB_CREATE_END"
        assert await client.wait() == 0
    await wait_gone([pid])


async def test_sigterm_ends_jobs_too(tmp_path):
    args, pidfile = sleeper(tmp_path, "term")
    async with invoke_server() as client:
        await client.created_job(1, attributes("/bin/sh", args, workdir=tmp_path))
        pid = await wait_for_file(pidfile)
        client.proc.send_signal(signal.SIGTERM)
        assert await client.wait() == 0
    await wait_gone([pid])


async def test_reply_pipe_closed_by_the_client_ends_the_server(tmp_path):
    args, pidfile = sleeper(tmp_path, "deaf")
    async with invoke_server() as client:
        await client.created_job(1, attributes("/bin/sh", args, workdir=tmp_path))
        pid = await wait_for_file(pidfile)
        await client.proc.stdout.aclose()
        await client.send(b"JOB_STATUS job-1\r\n")
        assert await client.wait() == 0
    await wait_gone([pid])


async def test_notify_pipe_closed_by_the_client_ends_the_server(tmp_path):
    args, pidfile = sleeper(tmp_path, "mute")
    async with invoke_server() as client:
        job = await client.created_job(1, attributes("/bin/sh", args, workdir=tmp_path))
        pid = await wait_for_file(pidfile)
        # the job's last notify before the pipe closes (else that one could find it broken first)
        await client.notifies_until(lambda l: l == f"STATUS_NOTIFY {job} ACTIVE started")
        await client.proc.stderr.aclose()
        # The CREATE_NOTIFY of the next job finds the pipe broken.
        await client.send(encode_job_create(2, attributes("/bin/true", ["x"], workdir=tmp_path)))
        assert await client.reply() == "S"
        assert await client.wait() == 0
    await wait_gone([pid])


# --------------------------------------------------------------------------- what a job gets


async def test_output_redirection_arguments_environment_and_directory(tmp_path):
    out, err = tmp_path / "out", tmp_path / "err"
    work = tmp_path / "work"
    work.mkdir()
    body = 'echo "$GREETING $1 in $(pwd)"; echo "EMPTY=[$EMPTY]"; echo oops >&2'
    async with invoke_server() as client:
        attrs = attributes("/bin/sh", ["-c", body, "sh", "big world"], workdir=work, out=out, err=err)
        attrs += [("environment", "GREETING=hello"), ("environment", "EMPTY")]
        job = await client.created_job(1, attrs)
        final = await client.final_status(job)
        assert final.status is InvokeStatus.DONE
    assert out.read_text() == f"hello big world in {work}\nEMPTY=[]\n"
    assert err.read_text() == "oops\n"


async def test_output_goes_nowhere_without_redirect(tmp_path):
    async with invoke_server() as client:
        job = await client.created_job(1, attributes("/bin/sh", ["-c", "echo loud; echo louder >&2"], workdir=tmp_path))
        await client.final_status(job)
        await client.send(b"EXIT\r\n")
        assert await client.reply() == "S"
        await client.wait()
        await client.drain()
    assert b"loud" not in client.out and b"loud" not in client.err


async def test_count_runs_that_many_copies(tmp_path):
    out = tmp_path / "out"
    async with invoke_server() as client:
        attrs = [(n, "3" if n == "count" else v) for n, v in attributes("/bin/sh", ["-c", "echo $$"], workdir=tmp_path, out=out)]
        job = await client.created_job(1, attrs)
        assert (await client.final_status(job)).status is InvokeStatus.DONE
    assert len(set(out.read_text().split())) == 3


async def test_staging_copies_the_program_and_makes_it_executable(tmp_path):
    source = script(tmp_path / "prog", 'echo "$0"\n', mode=0o644)
    stage = tmp_path / "stage"
    stage.mkdir()
    out = tmp_path / "out"
    async with invoke_server() as client:
        attrs = [(n, "true" if n == "staging" else v) for n, v in attributes(str(source), ["x"], workdir=tmp_path, out=out)]
        attrs.append(("tmp_dir", str(stage)))
        job = await client.created_job(1, attrs)
        assert (await client.final_status(job)).status is InvokeStatus.DONE
        ran = Path(out.read_text().strip())
        assert ran.parent.parent == stage and ran.name == "prog"
        await client.send(b"EXIT\r\n")
        assert await client.reply() == "S"
        await client.wait()
    assert list(stage.iterdir()) == []  # removed once the job ended
    assert not os.access(source, os.X_OK)


async def test_staging_into_a_missing_tmp_dir_fails_the_create(tmp_path):
    async with invoke_server() as client:
        attrs = [(n, "true" if n == "staging" else v) for n, v in attributes("/bin/true", ["x"], workdir=tmp_path)]
        attrs.append(("tmp_dir", str(tmp_path / "missing")))
        assert await client.create(1, attrs) == "S"
        line = await client.notify()
        assert line.startswith(f"CREATE_NOTIFY 1 F staging: cannot make a directory in {tmp_path / 'missing'}")


async def test_missing_program_fails_in_create_notify(tmp_path):
    async with invoke_server() as client:
        assert await client.create(1, attributes(str(tmp_path / "nothing"), ["x"], workdir=tmp_path)) == "S"
        assert await client.notify() == f"CREATE_NOTIFY 1 F executable '{tmp_path / 'nothing'}' not found"
        # The server goes on.
        job = await client.created_job(2, attributes("/bin/true", ["x"], workdir=tmp_path))
        assert job == "job-2"


# --------------------------------------------------------------------------- refusals


async def test_missing_mandatory_attribute_gets_f_naming_it(tmp_path):
    async with invoke_server() as client:
        attrs = [(n, v) for n, v in attributes("/bin/true", ["x"], workdir=tmp_path) if n != "port"]
        assert await client.create(1, attrs) == "F JOB_CREATE 1: missing mandatory attribute port"
        job = await client.created_job(2, attributes("/bin/true", ["x"], workdir=tmp_path))
        assert job == "job-1"
        await client.send(b"EXIT\r\n")
        assert await client.reply() == "S"
        await client.wait()
        await client.drain()
    assert b"CREATE_NOTIFY 1 " not in client.err


async def test_mpi_without_mpirun_gets_a_clear_f(tmp_path):
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    async with invoke_server(env={"PATH": str(empty)}) as client:
        attrs = [(n, "MPI" if n == "backend" else v) for n, v in attributes("/bin/true", ["x"], workdir=tmp_path)]
        reply = await client.create(1, attrs)
        assert reply == (
            "F JOB_CREATE 1: backend MPI starts the program through mpirun, but no mpirun was found on the PATH; "
            "install MPI or name one with the option 'mpirun /path/to/mpirun'"
        )


async def test_mpi_runs_through_the_mpirun_on_path(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script(bin_dir / "mpirun", 'echo "mpirun $*"\n')
    out = tmp_path / "out"
    async with invoke_server(env={"PATH": f"{bin_dir}:/usr/bin:/bin"}) as client:
        attrs = [
            (n, {"backend": "MPI", "count": "4"}.get(n, v))
            for n, v in attributes("/opt/app/stub", ["--jobID=1", "a b"], workdir=tmp_path, out=out)
        ]
        job = await client.created_job(1, attrs)
        assert (await client.final_status(job)).status is InvokeStatus.DONE
    assert out.read_text() == "mpirun -np 4 /opt/app/stub --jobID=1 a b\n"


async def test_bad_input_is_answered_and_the_server_keeps_serving(tmp_path):
    async with invoke_server() as client:
        await client.send(
            b"JOB_SUSPEND job-1\r\n"
            b"port 0\r\n"
            b"JOB_STATUS \xff\xfe\r\n"
            b"JOB_STATUS " + b"x" * 200000 + b"\r\n"
            b"JOB_CREATE 1\r\nargument caf\xe9\r\nJOB_CREATE_END\r\n"
        )
        assert (await client.reply()).startswith("F unknown request JOB_SUSPEND")
        assert "not valid UTF-8" in await client.reply()
        assert "longer than 65536 bytes" in await client.reply()
        assert "attribute line 6 (b'argument') is not valid UTF-8" in await client.reply()
        job = await client.created_job(2, attributes("/bin/true", ["x"], workdir=tmp_path))
        assert (await client.final_status(job)).status is InvokeStatus.DONE


async def test_unknown_scheduler_fails_in_create_notify(tmp_path):
    async with invoke_server() as client:
        attrs = attributes("/bin/true", ["x"], workdir=tmp_path, extra=[("scheduler", "slurm"), ("queue", "debug")])
        assert await client.create(1, attrs) == "S"
        line = await client.notify()
        assert line == "CREATE_NOTIFY 1 F no scheduler named 'slurm'; running: local"
        # A scheduler without a queue: its default queue, which the agent lacks.
        attrs = attributes("/bin/true", ["x"], workdir=tmp_path, extra=[("scheduler", "sge")])
        assert await client.create(2, attrs) == "S"
        line = await client.notify()
        assert line.startswith("CREATE_NOTIFY 2 F the agent runs no scheduler 'sge' (it runs local)"), line


async def test_options_on_the_command_line_are_defaults(tmp_path):
    async with invoke_server("--queue", "elsewhere") as client:
        assert await client.create(1, attributes("/bin/true", ["x"], workdir=tmp_path)) == "S"
        assert await client.notify() == "CREATE_NOTIFY 1 F no queue named 'elsewhere'; queues: local:default"
        attrs = attributes("/bin/true", ["x"], workdir=tmp_path, extra=[("queue", "default")])
        # Job ids are given with the S reply, so the failed request had one too.
        assert await client.created_job(2, attrs) == "job-2"


async def test_bad_command_line_refuses_every_request_with_the_reason(tmp_path):
    async with invoke_server("--frobnicate") as client:
        await client.send(b"QUERY_FEATURES\r\n" + encode_job_create(1, attributes("/bin/true", ["x"], workdir=tmp_path)))
        reason = "F the invoke server cannot start: unrecognized arguments: --frobnicate"
        assert await client.reply() == reason
        assert await client.reply() == reason
        await client.send(b"EXIT\r\n")
        assert await client.reply() == "S"
        assert await client.wait() == 0


def test_the_command_is_declared_for_installation():
    import importlib

    import pytest

    tomllib = pytest.importorskip("tomllib")

    project = tomllib.loads((Path(__file__).resolve().parent.parent / "pyproject.toml").read_text())
    target = project["project"]["scripts"]["proxy-invoke-server"]
    module, _, name = target.partition(":")
    assert callable(getattr(importlib.import_module(module), name))
    assert module == "proxy_agent.frontends.invoke.__main__"


# --------------------------------------------------------------------------- the loop against a scripted gateway


class ScriptedJobs:
    """A gateway whose jobs move only when the test says so."""

    def __init__(self) -> None:
        self.submitted = []
        self.cancelled = []
        self.fail_cancel = False
        self.refuse: Optional[str] = None
        self._send: Dict[int, trio.MemorySendChannel] = {}
        self._receive: Dict[int, trio.MemoryReceiveChannel] = {}

    async def submit(self, spec):
        if self.refuse:
            raise SubmitError(self.refuse, ErrorKind.NO_SUCH_QUEUE)
        key = 100 + len(self.submitted)
        self.submitted.append(spec)
        self._send[key], self._receive[key] = trio.open_memory_channel(10)
        self._send[key].send_nowait(JobUpdate(JobState.ACCEPTED))
        return key

    async def cancel(self, job):
        self.cancelled.append(job)
        if self.fail_cancel:
            raise JobError("the scheduler refused", ErrorKind.OPERATION_FAILED)

    def move(self, key: int, state: JobState, message: Optional[str] = None) -> None:
        self._send[key].send_nowait(JobUpdate(state, message))

    async def watch_gen(self, key):
        async for update in self._receive[key]:
            yield update
            if update.state.final:
                return

    def watch(self, job):
        return self.watch_gen(job)


@asynccontextmanager
async def scripted_server(jobs: ScriptedJobs):
    requests_in, requests_out = trio.testing.memory_stream_one_way_pair()
    replies_in, replies_out = trio.testing.memory_stream_one_way_pair()
    notifies_in, notifies_out = trio.testing.memory_stream_one_way_pair()
    server = InvokeServer(jobs, requests_out, replies_in, notifies_in, find_program=lambda n: None, exit_grace=1.0)
    result = {}

    async def run():
        result["why"] = await server.run()

    class Pipes:
        async def send(self, data: bytes) -> None:
            await requests_in.send_all(data)

        async def line(self, stream) -> str:
            data = b""
            with trio.fail_after(TIMEOUT):
                while not data.endswith(b"\r\n"):
                    data += await stream.receive_some(1)
            return data[:-2].decode()

        async def reply(self) -> str:
            return await self.line(replies_out)

        async def notify(self) -> str:
            return await self.line(notifies_out)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(run)
        pipes = Pipes()
        yield pipes
        await requests_in.aclose()
    pipes.why = result["why"]
    # the server has ended, everything it wrote is in the pipe: the rest of it, to its end
    await notifies_in.aclose()
    rest = b""
    while True:
        data = await notifies_out.receive_some(65536)
        if not data:
            break
        rest += data
    pipes.rest = rest.decode().split("\r\n")[:-1]


async def test_short_job_may_go_from_pending_straight_to_done():
    jobs = ScriptedJobs()
    async with scripted_server(jobs) as pipes:
        await pipes.send(encode_job_create(1, attributes("/bin/true", ["x"], workdir=Path("/tmp"))))
        assert await pipes.reply() == "S"
        assert await pipes.notify() == "CREATE_NOTIFY 1 S job-1"
        assert await pipes.notify() == "STATUS_NOTIFY job-1 PENDING queued"
        jobs.move(100, JobState.QUEUING)  # still PENDING: nothing to tell
        jobs.move(100, JobState.OTHER)  # says nothing: nothing to tell
        jobs.move(100, JobState.FINISHED, "exit status 0")
        assert await pipes.notify() == "STATUS_NOTIFY job-1 DONE exit status 0"
    assert pipes.why == "end of input"
    assert jobs.submitted[0].client_ref == "job-1"


async def test_destroy_while_the_job_ends_sends_one_final_notify():
    jobs = ScriptedJobs()
    async with scripted_server(jobs) as pipes:
        await pipes.send(encode_job_create(1, attributes("/bin/true", ["x"], workdir=Path("/tmp"))))
        assert await pipes.reply() == "S"
        assert await pipes.notify() == "CREATE_NOTIFY 1 S job-1"
        assert await pipes.notify() == "STATUS_NOTIFY job-1 PENDING queued"
        jobs.move(100, JobState.RUNNING)
        assert await pipes.notify() == "STATUS_NOTIFY job-1 ACTIVE started"
        await pipes.send(b"JOB_DESTROY job-1\r\n")
        assert await pipes.reply() == "S"
        jobs.move(100, JobState.KILLED, "cancelled")
        assert await pipes.notify() == "STATUS_NOTIFY job-1 DONE destroyed"
        await pipes.send(b"JOB_STATUS job-1\r\nEXIT\r\n")
        assert await pipes.reply() == "S DONE"
        assert await pipes.reply() == "S"
    assert jobs.cancelled == [100]
    assert pipes.why == "EXIT"


async def test_destroy_whose_cancel_fails_still_ends_with_a_final_notify():
    jobs = ScriptedJobs()
    jobs.fail_cancel = True
    async with scripted_server(jobs) as pipes:
        await pipes.send(encode_job_create(1, attributes("/bin/true", ["x"], workdir=Path("/tmp"))))
        assert await pipes.reply() == "S"
        await pipes.notify()
        await pipes.notify()
        await pipes.send(b"JOB_DESTROY job-1\r\n")
        assert await pipes.reply() == "S"
        assert await pipes.notify() == "STATUS_NOTIFY job-1 FAILED destroyed"
        # The job service reporting the end later changes nothing.
        jobs.move(100, JobState.FINISHED)


async def test_refused_submission_is_a_create_notify_failure():
    jobs = ScriptedJobs()
    jobs.refuse = "no queue named 'gpu'"
    async with scripted_server(jobs) as pipes:
        await pipes.send(encode_job_create(4, attributes("/bin/true", ["x"], workdir=Path("/tmp"))))
        assert await pipes.reply() == "S"
        assert await pipes.notify() == "CREATE_NOTIFY 4 F no queue named 'gpu'"
        await pipes.send(b"JOB_STATUS job-1\r\n")
        assert await pipes.reply() == "F JOB_STATUS: no job job-1"


async def test_exit_cancels_unfinished_jobs_and_waits_for_them():
    jobs = ScriptedJobs()
    async with scripted_server(jobs) as pipes:
        for rid in (1, 2):
            await pipes.send(encode_job_create(rid, attributes("/bin/true", ["x"], workdir=Path("/tmp"))))
            assert await pipes.reply() == "S"
            await pipes.notify()
            await pipes.notify()
        jobs.move(100, JobState.FINISHED)
        assert await pipes.notify() == "STATUS_NOTIFY job-1 DONE finished"
        await pipes.send(b"EXIT\r\n")
        assert await pipes.reply() == "S"
        with trio.fail_after(TIMEOUT):
            while jobs.cancelled != [101]:
                await trio.sleep(0.01)
        jobs.move(101, JobState.KILLED)
        assert await pipes.notify() == "STATUS_NOTIFY job-2 DONE finished"
    assert pipes.why == "EXIT"


async def test_a_destroy_after_the_end_was_told_adds_nothing():
    jobs = ScriptedJobs()
    async with scripted_server(jobs) as pipes:
        await pipes.send(encode_job_create(1, attributes("/bin/true", ["x"], workdir=Path("/tmp"))))
        assert await pipes.reply() == "S"
        assert await pipes.notify() == "CREATE_NOTIFY 1 S job-1"
        assert await pipes.notify() == "STATUS_NOTIFY job-1 PENDING queued"
        jobs.move(100, JobState.FINISHED, "exit status 0")
        assert await pipes.notify() == "STATUS_NOTIFY job-1 DONE exit status 0"
        await pipes.send(b"JOB_DESTROY job-1\r\nJOB_DESTROY job-1\r\nEXIT\r\n")
        assert [await pipes.reply() for _ in range(3)] == ["S", "S", "S"]
    assert pipes.rest == [] and jobs.cancelled == []


async def test_a_destroy_and_the_jobs_end_in_either_order_give_one_final_notify():
    for end_first in (True, False):
        jobs = ScriptedJobs()
        async with scripted_server(jobs) as pipes:
            await pipes.send(encode_job_create(1, attributes("/bin/true", ["x"], workdir=Path("/tmp"))))
            assert await pipes.reply() == "S"
            await pipes.notify()
            await pipes.notify()
            jobs.move(100, JobState.RUNNING)
            assert await pipes.notify() == "STATUS_NOTIFY job-1 ACTIVE started"
            if end_first:
                # the end is on its way to the server when the destroy comes
                jobs.move(100, JobState.FINISHED, "exit status 0")
                await pipes.send(b"JOB_DESTROY job-1\r\nJOB_DESTROY job-1\r\n")
            else:
                await pipes.send(b"JOB_DESTROY job-1\r\nJOB_DESTROY job-1\r\n")
                assert await pipes.reply() == "S"
                with trio.fail_after(TIMEOUT):
                    while jobs.cancelled != [100]:
                        await trio.sleep(0.01)
                jobs.move(100, JobState.KILLED, "cancelled")
                jobs.move(100, JobState.FINISHED, "exit status 0")  # a late report changes nothing
            final = await pipes.notify()
            assert final in ("STATUS_NOTIFY job-1 DONE exit status 0", "STATUS_NOTIFY job-1 DONE destroyed")
            await pipes.send(b"EXIT\r\n")
        assert pipes.rest == [], (end_first, pipes.rest)
        assert jobs.cancelled in ([], [100])


# --------------------------------------------------------------------------- the documented texts


def documented_exchanges() -> List[Tuple[str, str]]:
    """The ```exchange blocks of docs/invoke-server.md as (direction, line)."""
    import re

    text = (Path(__file__).resolve().parent.parent / "docs" / "invoke-server.md").read_text()
    lines = []
    for block in re.finditer(r"^```exchange\n(.*?)^```$", text, re.MULTILINE | re.DOTALL):
        for line in block.group(1).splitlines():
            direction, _, content = line.partition(" ")
            assert direction in (">", "<", "!"), line
            lines.append((direction, content))
    return lines


async def test_the_documented_exchanges_are_what_the_server_says(tmp_path):
    """Every error text and notify of docs/invoke-server.md's exchanges, played against the
    server: requests sent in order, each reply and notify as written there (a short job may
    also report PENDING and ACTIVE before its end), and nothing else."""
    exchange = documented_exchanges()
    assert len(exchange) > 20
    expected_notifies = []
    async with invoke_server(cwd=tmp_path) as client:
        batch = []
        for direction, line in exchange:
            if direction == ">":
                batch.append(line)
                continue
            if batch:
                await client.send("".join(f"{request}\r\n" for request in batch).encode())
                batch = []
            if direction == "<":
                assert await client.reply() == line
            else:
                expected_notifies.append(line)
                assert await client.find_notify(lambda found, line=line: found == line) == line
        assert not batch
        assert await client.wait() == 0
        await client.drain()
    written = client.err.decode().split("\r\n")[:-1]
    others = [line for line in written if line not in expected_notifies]
    assert all(line.split(" ")[2] in ("PENDING", "ACTIVE") for line in others), others
    assert all(len(lines) == 1 for lines in finals(client.err).values())
