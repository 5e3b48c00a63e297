"""The job service: several backends behind one model, requests routed by queue.

The service lives as long as the agent, not as long as a connection: front-end sessions
come and go and see the same model.  With a job store (:mod:`.store`) it records every
submission before the scheduler is called, each job's state as it changes and how much of its
output reached a client, and on start gives each backend back the jobs an earlier agent had
submitted to it (:meth:`~proxy_agent.service.backend.Backend.adopt`).  Each backend runs in the service's nursery; one that
fails to start is reported and left out while the others serve, and one that fails later is
reported and the rest carry on.

Requests name queues and jobs by service key, or queues by name: ``NAME`` (searched in every
backend, in the order they were given) or ``BACKEND:NAME``.  A submission that names no queue
goes to the first backend's default queue.  One that names several (or none, while a broker is
chosen) goes where a broker says (:mod:`.broker`).
"""

from __future__ import annotations

import logging
import os
import sqlite3
import time
from typing import Callable, Dict, List, Optional, Sequence, Set, Tuple, Union

import trio

from .backend import Backend, BackendContext
from .attributes import AttrInfo
from .brokering import ATTRIBUTES as BROKER_ATTRIBUTES
from .brokering import Brokering, Placement
from .coalloc.manager import DESCRIPTION_ATTRIBUTE as COALLOC_DESCRIPTION
from .history import JobOutput, OutputHistory, read_job_output
from .jobs import ErrorKind, JobError, JobSpec, SchedulersDown, ServiceError, SubmitError
from .model import K, Kind, ServiceModel, UnknownElement
from .recorder import FINAL_STATES, StoreRecorder
from .store import JobStore, StoredJob, StoreUnwritable, transient

log = logging.getLogger("proxy_agent.service")

__all__ = ["JobService", "Notice"]

#: notice(level, text): something for every client that belongs to no request
Notice = Callable[[str, str], None]

#: How long shutting the backends down may take in all.
_CLOSE_BOUND = 1.8
#: Seconds between two writes of noted state changes to the store.
_STORE_FLUSH = 0.5
#: The key of a job record's extra that holds the broker's decision (job attributes).
_BROKER_EXTRA = "broker"
#: How long after their end jobs are forgotten (store entry, kept output, files), unless
#: ``--keep-ended`` says otherwise.
KEEP_ENDED = 14 * 86400.0
#: How long after their end jobs stay in the model clients see, unless ``--show-ended``
#: says otherwise (they stay in the store, and in ``proxy-agent jobs``, until forgotten).
SHOW_ENDED = 24 * 3600.0
#: Seconds between two looks for ended jobs to take out of the model.
_SHOWN_CHECK = 60.0
#: Seconds between two looks for ended jobs to forget.
_FORGET_CHECK = 3600.0


class JobService:
    """Owns the model and the backends (see the module documentation)."""

    def __init__(self, model: Optional[ServiceModel] = None, store: Optional[JobStore] = None, *,
                 keep_ended: Optional[float] = KEEP_ENDED, show_ended: Optional[float] = SHOW_ENDED) -> None:
        self.model = model if model is not None else ServiceModel()
        self.backends: List[Backend] = []
        self._by_name: Dict[str, Backend] = {}
        #: backends that could not start: name -> why
        self.failures: Dict[str, str] = {}
        #: set when every backend added so far has started (or failed to); a backend added
        #: while the service runs makes a new one (see :meth:`start_backend`)
        self.ready = trio.Event()
        self._starting = 0
        self._listeners: List[Notice] = []
        #: notices every client is told when it starts listening: (level, text)
        self.standing: List[Tuple[str, str]] = []
        self._closing = False
        self._nursery: Optional[trio.Nursery] = None
        #: brokers, and the queue figures they rank by
        self.brokering = Brokering(self.model)
        #: multi-part jobs (a :class:`~.coalloc.manager.CoallocManager` attaches itself here)
        self.coalloc = None
        #: the job store (None: jobs do not outlive the agent)
        self.store = store
        #: the state directory the store is in (None without a store)
        self.state_dir = os.path.dirname(os.path.abspath(store.path)) if store is not None else None
        #: every stored job's output, kept in the state directory until the job is forgotten
        #: (None: no store could be read, so nothing is kept)
        self.history: Optional[OutputHistory] = None
        #: seconds after their end that jobs are forgotten / shown to clients (None: for ever)
        self.keep_ended = keep_ended
        self.show_ended = show_ended
        #: stored jobs that have ended: key -> when (for taking them out of the model)
        self._ended_at: Dict[int, float] = {}
        #: keys of the jobs the store holds
        self.stored: Set[int] = set()
        #: ``BACKEND:NAME`` of the queues (see queue_label)
        self._queue_labels: Dict[int, str] = {}
        self._stored_records: List[StoredJob] = []
        #: the standing notice saying the store cannot be written now
        self._unwritable_notice: Optional[Tuple[str, str]] = None
        #: ended jobs are due to be forgotten but the store cannot be written now (said once)
        self._forgetting_owed = False
        if store is not None:
            try:
                self._stored_records = store.jobs()
                self.model.reserve_keys(store.max_key())
            except sqlite3.Error as exc:
                self._store_failed(exc)
        self._recorder = StoreRecorder(self, self._job_ended)
        if self.store is not None and self.state_dir is not None:
            self.history = OutputHistory(self.state_dir)
            self.model.observe(self._recorder)
            self.model.record_output(self._recorder)
            self.store.on_change = self._store_writable_changed
            if self.store.unwritable is not None:
                self._store_writable_changed(self.store.unwritable)

    # ------------------------------------------------------------------ set-up

    def context(self, **settings) -> BackendContext:
        """A context for a backend of this service: its notices reach every client."""
        return BackendContext(notify=self.notify, **settings)

    def add_backend(self, backend: Backend) -> None:
        if backend.name in self._by_name:
            raise ValueError(f"scheduler {backend.name!r} given twice")
        self.backends.append(backend)
        self._by_name[backend.name] = backend
        self.brokering.track(backend.name, backend.queue_load)

    def start_backend(self, backend: Backend) -> None:
        """Add a backend to a service that may be running already: it starts at once, and
        :attr:`ready` waits for it (sessions that began before keep the event they had)."""
        self.add_backend(backend)
        if self._nursery is None:
            return  # started with the others by run()
        self._starting += 1
        if self.ready.is_set():
            self.ready = trio.Event()
        self._nursery.start_soon(self._run_backend, backend, self._one_started)

    def remove_failed_backend(self, name: str) -> None:
        """Forget a backend that failed to start, so that it can be added again."""
        backend = self._by_name.get(name)
        if backend is None or name not in self.failures:
            return
        self.backends.remove(backend)
        del self._by_name[name]
        del self.failures[name]

    def _one_started(self) -> None:
        self._starting -= 1
        if self._starting <= 0:
            self._starting = 0
            self.ready.set()

    def backend(self, name: str) -> Backend:
        try:
            return self._by_name[name]
        except KeyError:
            raise ServiceError(f"no scheduler named {name!r}; running: {', '.join(self._by_name)}",
                               ErrorKind.NO_SUCH_QUEUE) from None

    # ------------------------------------------------------------------ notices

    def add_listener(self, listener: Notice) -> Callable[[], None]:
        """Hear notices; returns a function that stops it."""
        self._listeners.append(listener)

        def remove() -> None:
            try:
                self._listeners.remove(listener)
            except ValueError:
                pass

        return remove

    def tell_every_client(self, level: str, text: str) -> None:
        """A notice that stands: told now, and to every client that starts listening later
        (see :attr:`standing`)."""
        self.standing.append((level, text))
        self.notify(level, text)

    def notify(self, level: str, text: str) -> None:
        log.log(logging.ERROR if level == "ERROR" else logging.WARNING if level == "WARNING" else logging.INFO,
                "%s", text)
        for listener in list(self._listeners):
            try:
                listener(level, text)
            except Exception:  # noqa: BLE001 - one listener must not silence the others
                log.exception("a notice listener failed")

    # ------------------------------------------------------------------ life cycle

    async def run(self, *, task_status: trio.TaskStatus = trio.TASK_STATUS_IGNORED) -> None:
        """Start every backend and serve until cancelled; started at once (discovery goes on
        in the background: :attr:`ready` is set when every backend has started or failed)."""
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                self._starting = len(self.backends)
                if not self.backends:
                    self.ready.set()
                if self.coalloc is not None:
                    await nursery.start(self.coalloc.run)
                for backend in self.backends:
                    nursery.start_soon(self._run_backend, backend, self._one_started)
                if self.store is not None:
                    nursery.start_soon(self._flush_store)
                    nursery.start_soon(self._tidy)
                task_status.started()
                await trio.sleep_forever()
        finally:
            self._nursery = None
            with trio.CancelScope(shield=True):
                await self.aclose()

    async def _run_backend(self, backend: Backend, started: Callable[[], None]) -> None:
        done = [False]

        class _Status:
            def started(self, value=None) -> None:
                if not done[0]:
                    done[0] = True
                    started()

        try:
            await backend.run(task_status=_AdoptingStatus(self, backend, _Status()))
        except Exception as exc:  # noqa: BLE001 - one backend's failure is contained
            why = describe(exc)
            if not done[0]:
                if isinstance(exc, ServiceError):  # the scheduler's own words say it all
                    log.error("the %s scheduler failed to start: %s", backend.name, why)
                else:
                    log.exception("the %s scheduler failed to start", backend.name)
                self.failures[backend.name] = f"the {backend.name} scheduler failed to start: {why}"
                if len(self.backends) > 1:
                    self.notify("ERROR", self.failures[backend.name])
                done[0] = True
                started()
            else:
                log.exception("the %s scheduler stopped", backend.name)
                self.notify("ERROR", f"the {backend.name} scheduler stopped: {why}")
        else:
            if not done[0]:
                done[0] = True
                started()

    def _adopt(self, backend: Backend) -> None:
        """Give a backend that has just started the stored jobs an earlier agent submitted to it
        (and learn the labels of its queues)."""
        model = self.model
        for key in model.keys(Kind.QUEUE):
            if model.get(key).owner == backend.name:
                self.queue_label(key)
        shown_since = None if self.show_ended is None else time.time() - self.show_ended
        records = [r for r in self._stored_records if r.backend == backend.name and r.key not in self.stored
                   and (r.ended is None or shown_since is None or r.ended >= shown_since)]
        if not records:
            return
        # What the backend learns while it adopts (output read again, an end) is recorded as
        # for any stored job; those it does not take are dropped again below.
        candidates = {r.key for r in records}
        self.stored.update(candidates)
        if self.history is not None:
            for record in records:
                # the backend reads the job's files again from where delivery stopped
                self.history.expect_rereading(record.key, record.delivered_offsets)
        try:
            adopted = backend.adopt(records)
        except Exception:  # noqa: BLE001 - a job that cannot be adopted must not stop the backend
            log.exception("the %s scheduler could not adopt its stored jobs", backend.name)
            self.stored.difference_update(candidates)
            return
        taken = set(adopted)
        self.stored.difference_update(candidates - taken)
        self._left_behind([r for r in records if r.key not in taken], backend.name)
        by_key = {r.key: r for r in records}
        for key in adopted:
            record = by_key.get(key)
            if record is not None and record.ended is not None:
                self._ended_at.setdefault(key, record.ended)
            chosen = record.extras.get(_BROKER_EXTRA) if record is not None else None
            if isinstance(chosen, dict) and key in self.model:
                self.model.update(key, {str(k): str(v) for k, v in chosen.items()})
            # what the backend learnt while adopting it (it may have ended meanwhile)
            self._recorder.note(key)
        if adopted:
            log.info("the %s scheduler adopted %d stored jobs", backend.name, len(adopted))

    def _left_behind(self, records: List[StoredJob], backend: str) -> None:
        """Jobs a running backend could not take back (the simulated scheduler's, records it
        cannot read) end in the store, so that the job list says so and they can be forgotten."""
        store = self.store
        pending = [r for r in records if r.ended is None]
        if store is None or not pending:
            return
        try:
            for record in pending:
                store.mark_lost(record.key, f"the {backend} scheduler could not take the job back after the agent "
                                            "that submitted it ended")
        except sqlite3.Error as exc:
            self._store_failed(exc)

    async def _flush_store(self) -> None:
        while True:
            await trio.sleep(_STORE_FLUSH)
            self._write_store()

    def flush_store(self) -> None:
        """Write the state changes noted so far to the store now (for a reader of the store)."""
        self._write_store()

    def _write_store(self) -> None:
        if self.history is not None:
            self.history.flush()
        store = self.store
        if store is None:
            return
        try:
            store.flush()
        except sqlite3.Error as exc:
            self._store_failed(exc)

    def _store_failed(self, exc: BaseException) -> None:
        log.error("the job store failed: %s", exc)
        self.store = None
        self._store_writable_changed(None)
        self.tell_every_client("WARNING", f"the job store failed ({exc}); jobs will not survive a restart of the agent")

    def _store_writable_changed(self, why: Optional[str]) -> None:
        """The store cannot be written now (``why``), or can again (None): every client is
        told, and a client that comes later hears only how things stand then."""
        notice = self._unwritable_notice
        if why is None:
            if notice is None:
                return
            self._unwritable_notice = None
            if notice in self.standing:
                self.standing.remove(notice)
            if self.store is not None:
                self.notify("INFO", "the job store can be written again; what the agent owed it is written, and new "
                                    "jobs are accepted")
            return
        if notice is not None:
            return
        self._unwritable_notice = ("WARNING", f"{why}; new jobs are refused until it can be written, and what the "
                                              "agent owes it is kept and written then (retrying)")
        self.tell_every_client(*self._unwritable_notice)

    # ------------------------------------------------------------------ ended jobs

    def _job_ended(self, key: int) -> None:
        """A stored job reached its final state (said again by a later change: kept once)."""
        if key not in self._ended_at:
            self._ended_at[key] = time.time()
            if self.history is not None:
                self.history.ended(key)

    async def _tidy(self) -> None:
        """Now and then: ended jobs leave the model after ``show_ended`` and are forgotten
        after ``keep_ended``."""
        await self.ready.wait()
        next_forget = 0.0
        while True:
            now = time.time()
            self.hide_ended(now)
            if now >= next_forget:
                self.forget_ended(now)
                # while the store cannot be written, it is tried again soon
                next_forget = now + (_SHOWN_CHECK if self._forgetting_owed else _FORGET_CHECK)
            await trio.sleep(_SHOWN_CHECK)

    def hide_ended(self, now: Optional[float] = None) -> List[int]:
        """Take the stored jobs that ended more than ``show_ended`` ago out of the model;
        returns their keys.  (Their backends are done with them: batch and simulated jobs
        leave the model by themselves long before; parts of multi-part jobs are left to
        their manager.)"""
        if self.show_ended is None:
            return []
        cutoff = (time.time() if now is None else now) - self.show_ended
        old = [key for key, when in self._ended_at.items() if when < cutoff]
        hidden = []
        model = self.model
        with model.batch():
            for key in old:
                del self._ended_at[key]
                element = model.lookup(key)
                if element is None or element.kind is not Kind.JOB:
                    continue
                if model.attr(key, K.STATE) in FINAL_STATES and model.attr(key, K.COALLOC_JOB) is None:
                    model.remove(key)
                    hidden.append(key)
        if hidden:
            log.info("%d jobs that ended more than %s ago left the model (they stay in the job list)", len(hidden),
                     duration_text(self.show_ended))
        return hidden

    def forget_ended(self, now: Optional[float] = None) -> List[int]:
        """Forget the stored jobs that ended more than ``keep_ended`` ago; returns their keys."""
        store = self.store
        if self.keep_ended is None or store is None or self.state_dir is None:
            return []
        from .statedir import forget_stored

        cutoff = (time.time() if now is None else now) - self.keep_ended
        try:
            forgotten = forget_stored(store, self.state_dir, ended_before=cutoff)["forgotten"]
        except StoreUnwritable as exc:
            # the next look tries again; clients are told the store cannot be written already
            if not self._forgetting_owed:
                log.warning("jobs that ended more than %s ago are not forgotten for now: %s",
                            duration_text(self.keep_ended), exc.message)
            self._forgetting_owed = True
            return []
        except sqlite3.Error as exc:
            self._store_failed(exc)
            return []
        if self._forgetting_owed:
            log.info("the job store can be written again: jobs that ended more than %s ago are forgotten again",
                     duration_text(self.keep_ended))
            self._forgetting_owed = False
        for key in forgotten:
            self.stored.discard(key)
            self._ended_at.pop(key, None)
            if self.history is not None:
                self.history.forget(key)
        if forgotten:
            log.info("forgot %d jobs that ended more than %s ago", len(forgotten), duration_text(self.keep_ended))
        return forgotten

    async def job_output(self, key: int, *, streams: Sequence[str] = ("stdout", "stderr"), rank: Optional[int] = None,
                         skip: Optional[Dict[Tuple[int, str], int]] = None) -> JobOutput:
        """The output a job has written so far, as kept (see :mod:`.history`): every line,
        whether or not a client saw it.  ``skip`` leaves out the first lines of streams
        (``{(rank, stream): lines}``).  JobError NO_SUCH_JOB for a job the store does not
        keep, NOT_SUPPORTED without a store."""
        store, history = self.store, self.history
        if store is None or history is None or self.state_dir is None:
            raise JobError("this agent keeps no output: its state directory or job store cannot be used (its first "
                           "message said why)", ErrorKind.NOT_SUPPORTED)
        try:
            known = store.job(key) is not None
        except sqlite3.Error as exc:
            if transient(exc):  # (busy, say: the store stays)
                raise JobError(f"the job store cannot be read now: {exc}", ErrorKind.UNAVAILABLE) from None
            self._store_failed(exc)
            raise JobError("the job store failed", ErrorKind.UNAVAILABLE) from None
        if not known:
            why = ("it was not submitted through this agent" if key in self.model else "it is not in the job list")
            raise JobError(f"no output is kept for job {key}: {why}", ErrorKind.NO_SUCH_JOB)
        history.flush()
        state_dir = self.state_dir
        dropped = history.dropped(key)  # (what a full disk has not taken yet is told too)
        return await trio.to_thread.run_sync(
            lambda: read_job_output(state_dir, key, rank=rank, streams=streams, skip=skip, dropped_now=dropped))

    def delivered(self, offsets: Dict[Tuple[int, str], int]) -> Optional[Dict[int, Dict[str, int]]]:
        """Output is about to reach a client: (process key, stream) -> where it ends in the
        backend's file.  Returns what to give :meth:`undeliver` if it does not get there."""
        store = self.store
        if store is None or not offsets:
            return None
        by_job: Dict[int, Dict[str, int]] = {}
        lookup = self.model.lookup
        for (process, stream), offset in offsets.items():
            element = lookup(process)
            if element is None or element.parent not in self.stored:
                continue
            by_job.setdefault(element.parent, {})[f"{element.rank}.{stream}"] = offset
        try:
            return store.record_delivered(by_job)
        except sqlite3.Error as exc:
            self._store_failed(exc)
            return None

    def undeliver(self, previous: Dict[int, Dict[str, int]]) -> None:
        """The output recorded by :meth:`delivered` did not reach the client after all."""
        store = self.store
        if store is None or not previous:
            return
        try:
            store.restore_delivered(previous)
        except sqlite3.Error as exc:
            self._store_failed(exc)

    @property
    def failure(self) -> Optional[str]:
        """Why the service cannot serve at all (every backend failed to start), else None."""
        if self.backends and len(self.failures) == len(self.backends):
            return "; ".join(self.failures.values())
        return None

    async def aclose(self) -> None:
        """End what the backends started (local jobs end; batch jobs stay in their scheduler)."""
        if self._closing:
            return
        self._closing = True
        with trio.move_on_after(_CLOSE_BOUND):
            async with trio.open_nursery() as nursery:
                for backend in self.backends:
                    nursery.start_soon(self._close_backend, backend)
        self._write_store()
        if self.history is not None:
            self.history.close()

    @staticmethod
    async def _close_backend(backend: Backend) -> None:
        try:
            await backend.aclose()
        except Exception:  # noqa: BLE001 - shutdown must finish
            log.exception("error while shutting down the %s scheduler", backend.name)

    # ------------------------------------------------------------------ catalogue

    def attributes(self) -> List[AttrInfo]:
        """What the running backends show and accept (first definition of a name wins)."""
        seen: Dict[str, AttrInfo] = {}
        for backend in self.backends:
            if backend.name in self.failures:
                continue
            for info in backend.attributes():
                seen.setdefault(info.name, info)
        for info in BROKER_ATTRIBUTES:
            seen.setdefault(info.name, info)
        for info in self.coalloc.attributes() if self.coalloc is not None else ():
            seen.setdefault(info.name, info)
        return list(seen.values())

    def running_backends(self, prefer: Sequence[str] = ()) -> List[Backend]:
        """The backends that run, those named in ``prefer`` first (in that order)."""
        running = [b for b in self.backends if b.name not in self.failures]
        if not prefer:
            return running
        first = [b for name in prefer for b in running if b.name == name]
        return first + [b for b in running if b not in first]

    # ------------------------------------------------------------------ routing

    def queue_key(self, queue: Union[int, str], prefer: Sequence[str] = ()) -> int:
        """The key of a queue given by key, ``NAME`` or ``BACKEND:NAME`` (a bare name is looked
        for in the backends of ``prefer`` first, then in the others in the order they came)."""
        model = self.model
        if isinstance(queue, int):
            try:
                model.find(queue, Kind.QUEUE)
            except UnknownElement:
                raise ServiceError("no such queue", ErrorKind.NO_SUCH_QUEUE) from None
            return queue
        text = queue.strip()
        backend_name, sep, name = text.rpartition(":")
        if sep:
            backend = self.backend(backend_name)
            for key in model.keys(Kind.QUEUE):
                element = model.get(key)
                if element.owner == backend.name and model.attr(key, K.NAME) == name:
                    return key
            raise ServiceError(self._no_queue(text), ErrorKind.NO_SUCH_QUEUE)
        for backend in self.running_backends(prefer):
            for key in model.keys(Kind.QUEUE):
                if model.get(key).owner == backend.name and model.attr(key, K.NAME) == text:
                    return key
        raise ServiceError(self._no_queue(text), ErrorKind.NO_SUCH_QUEUE)

    def _no_queue(self, text: str) -> str:
        names = [self.queue_label(k) for k in self.model.keys(Kind.QUEUE)]
        return f"no queue named {text!r}; queues: {', '.join(names) or 'none yet'}"

    def queue_label(self, key: int) -> str:
        """``BACKEND:NAME`` of a queue (remembered: a queue's key and name never change, so a
        submission's record names its queue without asking the model again)."""
        label = self._queue_labels.get(key)
        if label is None:
            element = self.model.get(key)
            name = self.model.attr(key, K.NAME)
            label = f"{element.owner}:{name or key}"
            if name:
                self._queue_labels[key] = label
        return label

    def default_queue(self, prefer: Sequence[str] = ()) -> Tuple[Backend, int]:
        """The default queue of the first running backend (of ``prefer``'s first, if any)."""
        for backend in self.running_backends(prefer):
            queue = backend.default_queue
            if queue is not None:
                return backend, queue
        raise SubmitError("no scheduler has a queue to submit to", ErrorKind.UNAVAILABLE)

    def route(self, spec: JobSpec, prefer: Sequence[str] = ()) -> Placement:
        """Where a submission goes: unpacks as ``(backend, queue)``.

        One queue named: that one.  Several, or none while a broker is chosen (the
        submission's or the agent's default): a broker picks among them, or among every queue
        of every running backend (without a broker, ``Null``: the first that can run the
        job); the placement then carries the broker's decision.  None and no broker: the
        first backend's default queue.  ``prefer`` names the backends whose queues a bare
        queue name and the default queue are looked for in first (the submitter's own).
        """
        if spec.queue is not None and spec.queue != "":
            return Placement(*self._owner_of(self.queue_key(spec.queue, prefer)))
        broker = spec.broker or self.brokering.default
        if not spec.candidates and not broker:
            return Placement(*self.default_queue(prefer))
        running = [b.name for b in self.running_backends()]
        if spec.candidates:
            queues = [self.queue_key(name, prefer) for name in spec.candidates]
        else:
            queues = self.brokering.all_queues(running)
        unusable = {key: "its scheduler is not running" for key in queues if self.model.get(key).owner not in running}
        decision = self.brokering.decide(spec, queues, broker, unusable)
        return Placement(*self._owner_of(decision.queue), decision)

    def _owner_of(self, queue: int) -> Tuple[Backend, int]:
        owner = self.model.get(queue).owner
        backend = self._by_name.get(owner)
        if backend is None or owner in self.failures:
            raise SubmitError(f"the scheduler of queue {self.queue_label(queue)} is not running", ErrorKind.UNAVAILABLE)
        return backend, queue

    def job_owner(self, job: int) -> Backend:
        try:
            element = self.model.find(job, Kind.JOB)
        except UnknownElement:
            raise JobError("no such job", ErrorKind.NO_SUCH_JOB) from None
        backend = self._by_name.get(element.owner)
        if backend is None:
            if self.coalloc is not None and element.owner == self.coalloc.name:
                return self.coalloc  # a multi-part job
            raise JobError("the job belongs to no running scheduler", ErrorKind.UNAVAILABLE)
        return backend

    # ------------------------------------------------------------------ requests

    async def submit(self, spec: JobSpec, prefer: Sequence[str] = (),
                     on_key: Optional[Callable[[int], None]] = None) -> int:
        """Submit a job; returns its key once it is in the model.

        ``prefer``: see :meth:`route`.  ``on_key`` is called with the job's key as soon as it
        has one, before its scheduler is asked (a fast job's output may come before this
        returns; a watcher set up then misses none of it).

        With a store, the submission is written (committed) before the scheduler is called,
        and completed with the scheduler's own id after; a refused one is removed again.
        Submissions that arrive together (a client that sends many at once: a task each) are
        committed in one transaction: each task notes its own and lets the others run once,
        and the first to come back commits every submission noted by then.
        """
        if self._closing:
            raise SubmitError("the agent is shutting down", ErrorKind.SHUTTING_DOWN)
        failure = self.failure
        if failure is not None:
            raise SchedulersDown(failure)
        if spec.extra_value(COALLOC_DESCRIPTION) is not None:
            if self.coalloc is None:
                raise SubmitError("this agent does not run multi-part jobs", ErrorKind.NOT_SUPPORTED)
            return await self.coalloc.submit(spec)
        placement = self.route(spec, prefer)
        backend, queue = placement.backend, placement.queue
        key = self.model.key_source.take(1)[0]  # numbered here: the store records it before the scheduler is asked
        if on_key is not None:
            on_key(key)
        store = self.store
        if store is not None:
            store.note_submission(key, backend.name, self.queue_label(queue), spec)
            # From now on its state and delivered output are recorded: a fast job's output
            # may reach a client before the scheduler's answer reaches this task.
            self.stored.add(key)
        try:
            if store is not None:
                await trio.lowlevel.checkpoint()  # the submissions that came with it are noted
                if self.store is store:
                    try:
                        store.commit_submission(key)
                    except StoreUnwritable as exc:
                        # no job is accepted that the store has not recorded
                        raise SubmitError(f"the job is refused: {exc.message}", ErrorKind.UNAVAILABLE) from None
                    except sqlite3.Error as exc:
                        self._store_failed(exc)
                if self.store is not store:  # the store failed: the job goes on without it
                    self.stored.discard(key)
                    store = None
            submitted = await backend.submit(spec, queue, key)
        except BaseException:
            self.stored.discard(key)
            if store is not None:
                try:
                    store.record_refused(key, "refused")
                except sqlite3.Error as exc:
                    self._store_failed(exc)
            raise
        actual = submitted.key
        if store is not None and self.store is store:
            try:
                if actual != key:
                    self.stored.discard(key)
                    store.rekey(key, actual)
                extra = dict(submitted.extra)
                if placement.decision is not None:
                    # an adopted job keeps the broker's choice and reason
                    extra[_BROKER_EXTRA] = placement.decision.job_attributes()
                native = submitted.native_id or ""
                if native or extra:  # else the record has it already (no id, no extra)
                    store.record_native_id(actual, native, extra)
                self.stored.add(actual)
            except sqlite3.Error as exc:
                self._store_failed(exc)
        self.brokering.record(actual, placement)
        return actual

    async def terminate(self, job: int) -> None:
        if self.coalloc is not None and self.coalloc.intercepts(job):
            await self.coalloc.terminate(job)  # a part before the barrier's release is deleted
            return
        await self.job_owner(job).terminate(job)

    async def release_barrier(self, job: int, wait_for_parts: bool = False) -> None:
        """Release a multi-part job's start barrier (now, or once every part has checked in)."""
        if self.coalloc is None:
            raise JobError("this agent does not run multi-part jobs", ErrorKind.NOT_SUPPORTED)
        await self.coalloc.release(job, wait_for_parts)

    async def hold(self, job: int, held: bool) -> None:
        await self.job_owner(job).hold(job, held)

    async def suspend(self, job: int, suspended: bool) -> None:
        await self.job_owner(job).suspend(job, suspended)

    async def move(self, job: int, queue: Union[int, str]) -> None:
        backend = self.job_owner(job)
        key = self.queue_key(queue)
        if self.model.get(key).owner != backend.name:
            raise JobError(
                f"queue {self.queue_label(key)} belongs to another scheduler than the job ({backend.name})",
                ErrorKind.OPERATION_FAILED,
            )
        await backend.move(job, key)


class _AdoptingStatus:
    """A backend's task status that adopts its stored jobs the moment it has started, before
    the service counts it as ready (so the first client already sees them)."""

    def __init__(self, service: JobService, backend: Backend, inner) -> None:
        self.service = service
        self.backend = backend
        self.inner = inner

    def started(self, value=None) -> None:
        self.service._adopt(self.backend)
        self.inner.started(value)


def duration_text(seconds: float) -> str:
    """A duration as people say it (``7 days``, ``2 hours``, ``90 s``)."""
    if seconds >= 86400 and seconds % 86400 == 0:
        return f"{seconds / 86400:g} days"
    if seconds >= 3600:
        return f"{seconds / 3600:g} hours"
    return f"{seconds:g} s"


def describe(exc: BaseException) -> str:
    """One line about an exception; for a group, about its first leaf."""
    leaves = getattr(exc, "exceptions", None)
    while leaves:
        exc = leaves[0]
        leaves = getattr(exc, "exceptions", None)
    if isinstance(exc, ServiceError):
        return exc.message
    return f"{type(exc).__name__}: {exc}" if not isinstance(exc, OSError) else str(exc)

