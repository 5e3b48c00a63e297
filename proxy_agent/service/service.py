"""The job service: several backends behind one model, requests routed by queue.

The service lives as long as the agent, not as long as a connection: front-end sessions
come and go and see the same model.  With a job store (:mod:`.store`) it records every
submission before the scheduler is called, each job's state as it changes and how much of its
output reached a client, and on start gives each backend back the jobs an earlier agent had
submitted to it (:meth:`~proxy_agent.schedulers.base.Backend.adopt`).  Each backend runs in the service's nursery; one that
fails to start is reported and left out while the others serve, and one that fails later is
reported and the rest carry on.

Requests name queues and jobs by service key, or queues by name: ``NAME`` (searched in every
backend, in the order they were given) or ``BACKEND:NAME``.  A submission that names no queue
goes to the first backend's default queue.  One that names several (or none, while a broker is
chosen) goes where a broker says (:mod:`.broker`).
"""

from __future__ import annotations

import logging
import sqlite3
from typing import Callable, Dict, List, Optional, Sequence, Set, Tuple, Union

import trio

from ..schedulers.base import Backend, BackendContext
from .attributes import AttrInfo
from .brokering import ATTRIBUTES as BROKER_ATTRIBUTES
from .brokering import Brokering, Placement
from .coalloc.manager import DESCRIPTION_ATTRIBUTE as COALLOC_DESCRIPTION
from .jobs import ErrorKind, JobError, JobSpec, ServiceError, SubmitError
from .model import ChangeSink, Element, K, Kind, ServiceModel, UnknownElement
from .store import JobStore, StoredJob, StoreUnwritable
from .jobs import JobState

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


class _StoreRecorder(ChangeSink):
    """Notes the state changes of stored jobs for the store."""

    takes_output = False

    def __init__(self, service: "JobService") -> None:
        self.service = service

    def changed(self, element: Element, slots) -> None:
        if element.kind is Kind.JOB and element.key in self.service.stored:
            self._note(element)

    def note(self, key: int) -> None:
        """Note the state of a stored job as the model has it now."""
        service = self.service
        if key not in service.stored:
            return
        element = service.model._elements.get(key)
        if element is not None and element.kind is Kind.JOB:
            self._note(element)

    def _note(self, element: Element) -> None:
        store = self.service.store
        if store is None:
            return
        values = element.values
        index = self.service.model.schema(Kind.JOB).index

        def value(name: str):
            slot = index.get(name)
            return values[slot] if slot is not None and slot < len(values) else None

        state = value(K.STATE)
        if not isinstance(state, str):
            return
        final = state in _FINAL_STATES
        message = value(K.MESSAGE)
        native = value(K.NATIVE_STATE)
        exit_code = value(K.EXIT_CODE) if final else ""
        signal = value(K.SIGNAL) if final else ""
        store.note_state(element.key, state, native if isinstance(native, str) else "",
                         message if isinstance(message, str) else None, final,
                         exit_code if isinstance(exit_code, str) else "",
                         signal if isinstance(signal, str) else "")


#: the states a job ends in
_FINAL_STATES = frozenset(state.value for state in JobState if state.final)


class JobService:
    """Owns the model and the backends (see the module documentation)."""

    def __init__(self, model: Optional[ServiceModel] = None, store: Optional[JobStore] = None) -> None:
        self.model = model if model is not None else ServiceModel()
        self.backends: List[Backend] = []
        self._by_name: Dict[str, Backend] = {}
        #: backends that could not start: name -> why
        self.failures: Dict[str, str] = {}
        self.ready = trio.Event()
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
        #: keys of the jobs the store holds
        self.stored: Set[int] = set()
        self._stored_records: List[StoredJob] = []
        #: the standing notice saying the store cannot be written now
        self._unwritable_notice: Optional[Tuple[str, str]] = None
        if store is not None:
            try:
                self._stored_records = store.jobs()
                self.model.reserve_keys(store.max_key())
            except sqlite3.Error as exc:
                self._store_failed(exc)
        self._recorder = _StoreRecorder(self)
        if self.store is not None:
            self.model.observe(self._recorder)
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
                pending = [len(self.backends)]

                def one_done() -> None:
                    pending[0] -= 1
                    if pending[0] <= 0:
                        self.ready.set()

                if not self.backends:
                    self.ready.set()
                if self.coalloc is not None:
                    await nursery.start(self.coalloc.run)
                for backend in self.backends:
                    nursery.start_soon(self._run_backend, backend, one_done)
                if self.store is not None:
                    nursery.start_soon(self._flush_store)
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
        """Give a backend that has just started the stored jobs an earlier agent submitted to it."""
        records = [r for r in self._stored_records if r.backend == backend.name and r.key not in self.stored]
        if not records:
            return
        try:
            adopted = backend.adopt(records)
        except Exception:  # noqa: BLE001 - a job that cannot be adopted must not stop the backend
            log.exception("the %s scheduler could not adopt its stored jobs", backend.name)
            return
        self.stored.update(adopted)
        taken = set(adopted)
        self._left_behind([r for r in records if r.key not in taken], backend.name)
        by_key = {r.key: r for r in records}
        for key in adopted:
            chosen = by_key[key].extras.get(_BROKER_EXTRA) if key in by_key else None
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

    def _write_store(self) -> None:
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

    def delivered(self, offsets: Dict[Tuple[int, str], int]) -> Optional[Dict[int, Dict[str, int]]]:
        """Output is about to reach a client: (process key, stream) -> where it ends in the
        backend's file.  Returns what to give :meth:`undeliver` if it does not get there."""
        store = self.store
        if store is None or not offsets:
            return None
        by_job: Dict[int, Dict[str, int]] = {}
        elements = self.model._elements
        for (process, stream), offset in offsets.items():
            element = elements.get(process)
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

    def running_backends(self) -> List[Backend]:
        return [b for b in self.backends if b.name not in self.failures]

    # ------------------------------------------------------------------ routing

    def queue_key(self, queue: Union[int, str]) -> int:
        """The key of a queue given by key, ``NAME`` or ``BACKEND:NAME``."""
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
        for backend in self.running_backends():
            for key in model.keys(Kind.QUEUE):
                if model.get(key).owner == backend.name and model.attr(key, K.NAME) == text:
                    return key
        raise ServiceError(self._no_queue(text), ErrorKind.NO_SUCH_QUEUE)

    def _no_queue(self, text: str) -> str:
        names = [self.queue_label(k) for k in self.model.keys(Kind.QUEUE)]
        return f"no queue named {text!r}; queues: {', '.join(names) or 'none yet'}"

    def queue_label(self, key: int) -> str:
        """``BACKEND:NAME`` of a queue."""
        element = self.model.get(key)
        return f"{element.owner}:{self.model.attr(key, K.NAME) or key}"

    def default_queue(self) -> Tuple[Backend, int]:
        for backend in self.running_backends():
            queue = backend.default_queue()
            if queue is not None:
                return backend, queue
        raise SubmitError("no scheduler has a queue to submit to", ErrorKind.UNAVAILABLE)

    def route(self, spec: JobSpec) -> Placement:
        """Where a submission goes: unpacks as ``(backend, queue)``.

        One queue named: that one.  Several, or none while a broker is chosen (the
        submission's or the agent's default): a broker picks among them, or among every queue
        of every running backend (without a broker, ``Null``: the first that can run the
        job); the placement then carries the broker's decision.  None and no broker: the
        first backend's default queue.
        """
        if spec.queue is not None and spec.queue != "":
            return Placement(*self._owner_of(self.queue_key(spec.queue)))
        broker = spec.broker or self.brokering.default
        if not spec.candidates and not broker:
            return Placement(*self.default_queue())
        running = [b.name for b in self.running_backends()]
        if spec.candidates:
            queues = [self.queue_key(name) for name in spec.candidates]
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

    def _job_owner(self, job: int) -> Backend:
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

    async def submit(self, spec: JobSpec) -> int:
        """Submit a job; returns its key once it is in the model.

        With a store, the submission is written (committed) before the scheduler is called,
        and completed with the scheduler's own id after; a refused one is removed again.
        Submissions that arrive together (a client that sends many at once: a task each) are
        committed in one transaction: each task notes its own and lets the others run once,
        and the first to come back commits every submission noted by then.
        """
        if self._closing:
            raise SubmitError("the agent is shutting down", ErrorKind.SHUTTING_DOWN)
        if spec.extra_value(COALLOC_DESCRIPTION) is not None:
            if self.coalloc is None:
                raise SubmitError("this agent does not run multi-part jobs", ErrorKind.NOT_SUPPORTED)
            return await self.coalloc.submit(spec)
        placement = self.route(spec)
        backend, queue = placement.backend, placement.queue
        key = self.model.new_keys(1)[0]
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
            actual = await backend.submit(spec, queue, key)
        except BaseException:
            self.stored.discard(key)
            if store is not None:
                try:
                    store.record_refused(key, "refused")
                except sqlite3.Error as exc:
                    self._store_failed(exc)
            raise
        if store is not None and self.store is store:
            try:
                if actual != key:
                    self.stored.discard(key)
                    store.rekey(key, actual)
                extra = dict(backend.job_extra(actual))
                if placement.decision is not None:
                    # an adopted job keeps the broker's choice and reason
                    extra[_BROKER_EXTRA] = placement.decision.job_attributes()
                native = backend.native_id(actual) or ""
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
        await self._job_owner(job).terminate(job)

    async def release_barrier(self, job: int, wait_for_parts: bool = False) -> None:
        """Release a multi-part job's start barrier (now, or once every part has checked in)."""
        if self.coalloc is None:
            raise JobError("this agent does not run multi-part jobs", ErrorKind.NOT_SUPPORTED)
        await self.coalloc.release(job, wait_for_parts)

    async def hold(self, job: int, held: bool) -> None:
        await self._job_owner(job).hold(job, held)

    async def suspend(self, job: int, suspended: bool) -> None:
        await self._job_owner(job).suspend(job, suspended)

    async def move(self, job: int, queue: Union[int, str]) -> None:
        backend = self._job_owner(job)
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


def describe(exc: BaseException) -> str:
    """One line about an exception; for a group, about its first leaf."""
    while getattr(exc, "exceptions", None):
        exc = exc.exceptions[0]  # type: ignore[attr-defined]
    if isinstance(exc, ServiceError):
        return exc.message
    return f"{type(exc).__name__}: {exc}" if not isinstance(exc, OSError) else str(exc)


def backends_from_names(names: Sequence[str]) -> List[str]:
    """Split and check a ``--scheduler`` list (``local,sim``)."""
    out: List[str] = []
    for name in names:
        if name in out:
            raise ValueError(f"scheduler {name!r} given twice")
        out.append(name)
    return out
