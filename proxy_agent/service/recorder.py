"""The service's ear on its model for the job store: each stored job's state as it changes,
and every line of its output for the kept output (:mod:`.history`).  The service registers
it as an observer and an output recorder of the model when it has a store."""

from __future__ import annotations

from typing import Callable, Optional, Protocol, Set

from .history import OutputHistory
from .jobs import JobState
from .model import ChangeSink, Element, K, Kind, ServiceModel
from .store import JobStore

#: the states a job ends in
FINAL_STATES = frozenset(state.value for state in JobState if state.final)


class RecordedService(Protocol):
    """What the recorder reads of the service (which may drop its store while it runs)."""

    model: ServiceModel
    stored: Set[int]
    store: Optional[JobStore]
    history: Optional[OutputHistory]


class StoreRecorder(ChangeSink):
    """Notes the state changes of stored jobs for the store, and keeps their output."""

    takes_output = False

    def __init__(self, service: RecordedService, ended: Callable[[int], None]) -> None:
        self.service = service
        #: told the key of a stored job that reached its final state
        self.ended = ended

    def changed(self, element: Element, slots) -> None:
        if element.kind is Kind.JOB and element.key in self.service.stored:
            self._note(element)

    def output(self, element: Element, stream: str, text: str, offset: Optional[int] = None) -> None:
        """Every line of a stored job is kept (see :mod:`.history`)."""
        history = self.service.history
        if history is not None and element.parent in self.service.stored:
            history.record(element.parent, element.rank, stream, text, offset)

    def note(self, key: int) -> None:
        """Note the state of a stored job as the model has it now."""
        service = self.service
        if key not in service.stored:
            return
        element = service.model.lookup(key)
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
        final = state in FINAL_STATES
        if final:
            self.ended(element.key)
        message = value(K.MESSAGE)
        native = value(K.NATIVE_STATE)
        exit_code = value(K.EXIT_CODE) if final else ""
        signal = value(K.SIGNAL) if final else ""
        native_id = value(K.NATIVE_ID)
        store.note_state(element.key, state, native if isinstance(native, str) else "",
                         message if isinstance(message, str) else None, final,
                         exit_code if isinstance(exit_code, str) else "",
                         signal if isinstance(signal, str) else "",
                         native_id if isinstance(native_id, str) else "")
