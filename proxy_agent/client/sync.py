"""A synchronous face on the client, for scripts that do not use trio.

::

    from proxy_agent.client.sync import Agent

    with Agent.spawn() as agent:                 # or Agent.ssh("cluster"), Agent.connect_unix(path)
        job = agent.submit("/bin/echo", ["hello"], count=2)
        job.wait(timeout=60)                     # returns the final jobStatus, e.g. "FINISHED"
        print(job.state, job.status, job.exit_codes)
        print(job.stdout)
        other = agent.submit("/bin/sleep", ["600"])
        other.cancel()

The session runs in a worker thread of its own with its own trio loop; every method hands
its work to that thread (``trio.from_thread``) and blocks until it is done.  Nothing in the
calling thread's own event loop is needed, so the methods work from plain Python, from other
threads, and from inside a running asyncio program without deadlock: a call made from an
asyncio coroutine blocks that coroutine's loop only while the worker does the work.  Short
calls (submit, state, cancel) are fine there as they are; for a long wait, keep the asyncio
loop free by running it in a thread::

    async def main():
        with Agent.spawn() as agent:
            job = agent.submit("/bin/sleep", ["5"])
            await asyncio.to_thread(job.wait, 60)   # other tasks run meanwhile

The one thing that cannot work is calling these methods from the worker thread itself (from
a listener of the underlying :class:`~proxy_agent.client.AgentClient`): that raises
RuntimeError instead of deadlocking.

Errors are the client's own (:mod:`proxy_agent.client.errors`): ``CommandFailed`` for a
refused command, ``WaitTimeout`` (a ``TimeoutError`` too) when a wait runs out,
``ConnectionClosed``/``AgentExited`` once the session is over, ``ConnectError`` when it cannot
start (naming the cause when a shell start-up file printed to the stream).
"""

from __future__ import annotations

import threading
from typing import Any, Awaitable, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, TypeVar, Union

import trio

from .connection import NO_KEPT_OUTPUT, AgentClient
from .diagnose import garbage_before_first_frame
from .errors import (AgentExited, ClientError, CommandFailed, ConnectError, ConnectionClosed, ProtocolViolationError,
                     UnknownElementError, WaitTimeout)
from .state import Element

__all__ = ["Agent", "Job", "WaitTimeout"]

T = TypeVar("T")

#: How long a session may take to start (INIT, MODEL_DEF, START_EVENTS).
START_TIMEOUT = 60.0
#: How long closing waits for the agent's SHUTDOWN.
QUIT_TIMEOUT = 10.0



class Job:
    """A submitted job, as PSI/J's and submitit's job objects: wait, state, output, cancel.

    ``id`` is the job's id as every tool names it (``proxy-agent jobs``, the console, the
    agent's log): a number.  Every property reads the session's mirror at the moment it
    is read; ``stdout`` and ``stderr`` ask the agent for the output it keeps.
    """

    def __init__(self, agent: "Agent", element_id: str, key: int) -> None:
        self._agent = agent
        #: the job's element id in this session (a detail of the protocol)
        self._element_id = element_id
        self.id = key

    def _element(self) -> Element:
        return self._agent._client_now().job(self._element_id)

    def _read(self, read: Callable[[Element], T]) -> T:
        return self._agent._sync(lambda: read(self._element()))

    @property
    def sub_id(self) -> Optional[str]:
        """The submitter's reference (jobSubId)."""
        return self._read(lambda job: job.sub_id)

    @property
    def name(self) -> str:
        return self._read(lambda job: job.name)

    @property
    def state(self) -> Optional[str]:
        """The protocol's coarse state (jobState): STARTING, RUNNING, SUSPENDED, COMPLETED."""
        return self._read(lambda job: job.state)

    @property
    def status(self) -> Optional[str]:
        """The detailed state (jobStatus), such as QUEUING, RUNNING, FINISHED, FAILED, KILLED."""
        return self._read(lambda job: _text(job.get("jobStatus")))

    @property
    def done(self) -> bool:
        return self.state == "COMPLETED"

    @property
    def states(self) -> List[str]:
        """Every jobState the job was seen in, in order."""
        return self._read(lambda job: list(job.states))

    @property
    def stdout(self) -> str:
        """Everything the job's processes have written to stdout so far, process by process,
        as the agent keeps it: also what this session did not see live."""
        return self.output("stdout")

    @property
    def stderr(self) -> str:
        """As :attr:`stdout`, for standard error."""
        return self.output("stderr")

    def output(self, stream: str = "stdout", rank: Optional[int] = None) -> str:
        """One stream of the job's output so far, every process's (rank by rank) or one's,
        a line each.  From an agent that keeps no output of the job, what this session saw."""
        agent = self._agent

        async def read() -> str:
            client = agent._client_now()
            try:
                kept = await client.kept_output(self._element_id, stream=stream, rank=rank)
            except CommandFailed as exc:
                if exc.code not in NO_KEPT_OUTPUT:
                    raise
                processes = [p for p in client.children(self._element_id, "process") if rank in (None, p.rank)]
                return "".join(p.text(stream) for p in sorted(processes, key=lambda p: p.rank or 0))
            return kept.text(stream, rank)

        return agent._run(read)

    @property
    def exit_codes(self) -> List[int]:
        """Exit statuses of the job's ended processes (signalled ones are left out)."""

        def read(job: Element) -> List[int]:
            client = self._agent._client_now()
            codes = []
            for process in client.children(job, "process"):
                code = process.get("processExitCode")
                if isinstance(code, str) and code.lstrip("-").isdigit():
                    codes.append(int(code))
            return codes

        return self._read(read)

    @property
    def attributes(self) -> Dict[str, Union[str, List[str]]]:
        return self._read(lambda job: {k: (list(v) if isinstance(v, list) else v) for k, v in job.attributes.items()})

    def wait(self, timeout: Optional[float] = None, state: str = "COMPLETED") -> Optional[str]:
        """Block until the job has been in ``state`` (a jobState; default: until it ends).

        Returns its jobStatus then.  Raises ``WaitTimeout`` after ``timeout`` seconds, and
        ``WaitFailed`` when it ends without reaching ``state``.
        """
        agent = self._agent

        async def wait() -> Optional[str]:
            client = agent._client_now()
            job = await client.wait_job_state(self._element_id, state.upper(), timeout)
            return _text(job.get("jobStatus"))

        return agent._run(wait)

    def cancel(self, timeout: Optional[float] = 60) -> None:
        """Ask the agent to terminate the job (TERMINATE_JOB); returns once it accepted."""
        agent = self._agent
        agent._run(lambda: agent._client_now().terminate(self._element_id, timeout=timeout))

    def __repr__(self) -> str:
        try:
            return f"<Job {self.id} {self.state} {self.status}>"
        except ClientError:
            return f"<Job {self.id}>"


class Agent:
    """A session with an agent, driven from synchronous code (see the module text).

    Open one with :meth:`spawn`, :meth:`ssh`, :meth:`connect_tcp` or :meth:`connect_unix`;
    close it with :meth:`close` or a ``with`` block (a spawned or ssh agent is sent QUIT).
    """

    def __init__(
        self,
        opener: Callable[[], Awaitable[AgentClient]],
        *,
        quit_on_close: bool,
        token: Optional[str] = None,
        base_id: int = 1000,
        start_timeout: float = START_TIMEOUT,
        explain_exit: Optional[Callable[[AgentExited], Optional[str]]] = None,
    ) -> None:
        self._opener = opener
        #: what an agent that ended during start-up means, when the way it was started says more
        self._explain_exit = explain_exit
        self._quit_on_close = quit_on_close
        self._token = token
        self._base_id = base_id
        self._start_timeout = start_timeout
        self._client: Optional[AgentClient] = None
        self._trio_token: Optional[trio.lowlevel.TrioToken] = None
        self._stop: Optional[trio.Event] = None
        self._ready = threading.Event()
        self._startup_error: Optional[BaseException] = None
        self._closed = False
        self._thread = threading.Thread(target=self._thread_main, name="proxy-agent-client", daemon=True)
        self._thread.start()
        self._ready.wait()
        if self._startup_error is not None:
            self._thread.join(QUIT_TIMEOUT)
            raise self._startup_error

    # ------------------------------------------------------------------ opening

    @classmethod
    def spawn(
        cls, argv: Optional[Sequence[str]] = None, *, env: Optional[Mapping[str, str]] = None,
        cwd: Optional[str] = None, **options: Any,
    ) -> "Agent":
        """Start an agent as a child (default: this installation's, local scheduler)."""
        if argv is None:
            from .remote import own_agent_argv

            argv = own_agent_argv()
        command = list(argv)
        return cls(lambda: AgentClient.spawn(command, env=env, cwd=cwd), quit_on_close=True, **options)

    @classmethod
    def ssh(
        cls, destination: str, *, remote_agent: Optional[str] = None, ssh_config: Optional[str] = None,
        port: Optional[int] = None, ssh_options: Sequence[str] = (), **options: Any,
    ) -> "Agent":
        """Start the agent on another host through ssh, as ``proxy-console --ssh`` does."""
        from .remote import (SshTarget, default_remote_command, environ_without_token, remote_command,
                                      ssh_exit_reason)

        try:
            target = SshTarget(destination, config=ssh_config, port=port, options=tuple(ssh_options), batch=True)
        except ValueError as exc:
            raise ConnectError(str(exc)) from None
        command = remote_command(remote_agent, ["--stdio"]) if remote_agent else default_remote_command(["--stdio"])
        argv = target.ssh(command)
        return cls(lambda: AgentClient.spawn(argv, env=environ_without_token()), quit_on_close=True,
                   explain_exit=lambda exc: ssh_exit_reason(target.destination, exc.returncode, exc.stderr_tail),
                   **options)

    @classmethod
    def connect_tcp(cls, host: str, port: int, *, token: Optional[str] = None, **options: Any) -> "Agent":
        """Connect to an agent started with ``--listen`` (it needs its token)."""
        return cls(lambda: AgentClient.connect_tcp(host, port), quit_on_close=False, token=token, **options)

    @classmethod
    def connect_unix(cls, path: str, **options: Any) -> "Agent":
        """Connect to an agent started with ``--unix PATH``."""
        return cls(lambda: AgentClient.connect_unix(path), quit_on_close=False, **options)

    # ------------------------------------------------------------------ the worker thread

    def _thread_main(self) -> None:
        try:
            trio.run(self._serve)
        except BaseException as exc:  # noqa: BLE001 - handed to the thread that waits for start-up
            if not self._ready.is_set():
                self._startup_error = exc
        finally:
            self._ready.set()

    async def _serve(self) -> None:
        self._trio_token = trio.lowlevel.current_trio_token()
        self._stop = trio.Event()
        try:
            client = await self._opener()
        except ClientError as exc:
            self._startup_error = exc
            return
        async with client:
            try:
                await self._start(client)
            except ConnectionClosed as exc:
                # The session ended before it started: the agent could not be started or reached.
                self._startup_error = ConnectError(self._why_ended(exc))
                self._startup_error.__cause__ = exc
                return
            except ClientError as exc:
                self._startup_error = exc
                return
            self._client = client
            self._ready.set()
            await self._stop.wait()
            if self._quit_on_close and client.ended is None:
                with trio.move_on_after(QUIT_TIMEOUT):
                    try:
                        await client.quit()
                    except ClientError:
                        pass  # the session is over either way

    async def _start(self, client: AgentClient) -> None:
        frames: List[int] = []
        client.add_listener(lambda t: frames.append(1) if t.direction == "in" and t.message is not None else None)
        try:
            with trio.fail_after(self._start_timeout):
                await client.init(self._base_id, token=self._token)
                await client.model_def()
                await client.start_events()
        except trio.TooSlowError:
            raise ConnectError(f"the session with {client.peer} did not start within {self._start_timeout:g} s") from None
        except ProtocolViolationError as exc:
            if not frames and exc.violation.rule == "framing":
                explained = garbage_before_first_frame(exc.violation.raw)
                if explained:
                    raise ConnectError(explained) from exc
            raise

    def _why_ended(self, exc: ConnectionClosed) -> str:
        explained = self._explain_exit(exc) if self._explain_exit and isinstance(exc, AgentExited) else None
        if explained:
            return explained
        first, _, rest = str(exc).partition("; its last output:")
        tail = [line.strip() for line in rest.splitlines() if line.strip()]
        return f"{first}: {tail[-1]}" if tail else first

    def _client_now(self) -> AgentClient:
        if self._client is None:
            raise ConnectError("the session is not open")
        return self._client

    def _check_thread(self) -> None:
        if self._closed:
            raise ConnectError("this Agent is closed")
        if threading.current_thread() is self._thread:
            raise RuntimeError("Agent methods block; they cannot be called from the session's own thread")

    def _run(self, work: Callable[[], Awaitable[T]]) -> T:
        """Run ``await work()`` in the session's thread and return its result here."""
        self._check_thread()
        return trio.from_thread.run(work, trio_token=self._trio_token)

    def _sync(self, read: Callable[[], T]) -> T:
        """Call ``read()`` in the session's thread (a consistent look at the mirror)."""
        self._check_thread()
        return trio.from_thread.run_sync(read, trio_token=self._trio_token)

    # ------------------------------------------------------------------ use

    def submit(
        self, executable: str, args: Iterable[str] = (), *, count: int = 1,
        env: Union[Mapping[str, str], Iterable[str], None] = None, cwd: Optional[str] = None,
        queue: Optional[str] = None, timeout: Optional[float] = 60, **attributes: Any,
    ) -> Job:
        """Submit a job and return it once the agent has announced it (NEW_JOB)."""
        arguments = list(args)

        async def submit() -> str:
            return await self._client_now().submit(
                executable, arguments, count=count, env=env, cwd=cwd, queue=queue, timeout=timeout, **attributes
            )

        return self._job_of(self._run(submit))

    def _job_of(self, element_id: str) -> Job:
        return Job(self, element_id, self._sync(lambda: self._client_now().job_key(element_id)))

    def job(self, ref: Union[int, str]) -> Job:
        """A job in the model by its id (``proxy-agent jobs`` shows it: a number, or its text),
        its jobSubId, or its name (one job's)."""

        def find() -> str:
            client = self._client_now()
            text = str(ref)
            if text.isascii() and text.isdigit():
                found = client.job_by_key(int(text))
                if found is not None:
                    return found.id
            found = client.state.jobs_by_sub.get(text)
            if found is not None:
                return found.id
            named = [job for job in client.jobs.values() if job.name == text]
            if len(named) == 1:
                return named[0].id
            if named:
                ids = ", ".join(sorted(str(client.job_key(job)) for job in named))
                raise UnknownElementError(f"{len(named)} jobs are named {text!r} (ids {ids}); give one id")
            raise UnknownElementError(f"no job {text} in the model (give its id, its jobSubId or its name)")

        return self._job_of(self._sync(find))

    def jobs(self) -> List[Job]:
        return [self._job_of(job_id) for job_id in self._sync(lambda: list(self._client_now().jobs))]

    @property
    def queues(self) -> List[str]:
        return self._sync(lambda: [q.name or q.id for q in self._client_now().queues.values()])

    @property
    def nodes(self) -> List[str]:
        return self._sync(lambda: [n.name or n.id for n in self._client_now().nodes.values()])

    @property
    def alive(self) -> bool:
        """The session is still open (the agent has not gone away)."""
        return not self._closed and self._client is not None and self._client.ended is None

    def close(self) -> None:
        """End the session (QUIT for an agent this object started) and stop the worker thread."""
        if self._closed:
            return
        if threading.current_thread() is self._thread:
            raise RuntimeError("Agent.close() cannot be called from the session's own thread")
        self._closed = True
        if self._trio_token is not None and self._stop is not None and self._thread.is_alive():
            try:
                trio.from_thread.run_sync(self._stop.set, trio_token=self._trio_token)
            except trio.RunFinishedError:
                pass
        self._thread.join(QUIT_TIMEOUT + 5)

    def __enter__(self) -> "Agent":
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()


def _text(value: Any) -> Optional[str]:
    return value if isinstance(value, str) else None
