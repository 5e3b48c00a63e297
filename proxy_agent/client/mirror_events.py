"""How the client's state applies the agent's model events (NEW, CHANGE, REMOVE and the
process events) to its mirror of the model, checking each against the protocol."""

from __future__ import annotations

from typing import Dict, Hashable, Iterable, List, Optional, Tuple, Union


from ..protocol.dialect import CLIENT_ARRAY_ATTRIBUTES
from ..protocol.ids import is_decimal
from ..protocol.messages import (
    ElementChange, ElementKind, Event, NewElements, ProcessChange, RemoveAll, RemoveElements, RemoveProcesses,
)
from ..protocol.rangeset import RangeSet
from .records import (
    Element, MAX_IDS_PER_EVENT, OUTPUT_KEYS, OutputLine, PARENT_KIND, RAN_STATUSES, RM, STATE_KEYS, Violation,
    canonical_id, event_id_sets, id_count, id_rule, ids_of, type_name,
)

class ModelEvents:
    """The model events of a :class:`~.state.ClientState` (see the module documentation)."""

    def _apply(self, event: Event, problems: List[Violation]) -> None:
        self.model_events += 1
        name = event.event_id.name
        total = 0
        for ids in event_id_sets(event):
            total += id_count(ids)
        if total > MAX_IDS_PER_EVENT:
            problems.append(
                Violation("too-many-ids", f"{name} names {total} elements (more than {MAX_IDS_PER_EVENT}); not applied")
            )
            return
        if self.dialect.ascii_only:
            self._check_ids(event, problems)
        if isinstance(event, NewElements):
            if event.kind is ElementKind.PROCESS:
                self._new_processes(event, problems)
            else:
                self._new(event, problems)
        elif isinstance(event, ProcessChange):
            self._process_change(event, problems)
        elif isinstance(event, ElementChange):
            self._change(event, problems)
        elif isinstance(event, RemoveProcesses):
            self._remove_processes(event, problems)
        elif isinstance(event, RemoveElements):
            for eid in ids_of(event.ids):
                element = self._expect(eid, event.kind.value, name, problems)
                if element is not None:
                    self._remove(element)
        elif isinstance(event, RemoveAll):
            for element in list(self.elements.values()):
                if element.kind != RM:
                    self._remove(element)

    def _check_ids(self, event: Event, problems: List[Violation]) -> None:
        """Default dialect: element ids are numbers the client can hold as a Java int."""
        name = event.event_id.name
        highest = self.dialect.max_element_id
        scoped = isinstance(event, (ProcessChange, RemoveProcesses)) or (
            isinstance(event, NewElements) and event.kind is ElementKind.PROCESS
        )
        # The id in front (parent, or the job of a process event) is an element id too.
        head = getattr(event, "parent_id", None) or getattr(event, "job_id", None)
        texts = [head] if head is not None else []
        for text in texts:
            if not is_decimal(text) or int(text) > highest:
                problems.append(Violation("element-id", f"{name} names element {text!r}: {id_rule(highest)}"))
        for ids in event_id_sets(event):
            if isinstance(ids, str):
                problems.append(Violation("element-id", f"{name} names element {ids!r}: {id_rule(highest)}"))
            elif ids and ids.last > highest:
                what = "process rank" if scoped else "element id"
                problems.append(Violation("element-id", f"{name} names {what} {ids.last}: {id_rule(highest)}"))

    def _expect(self, eid: Hashable, kind: str, event: str, problems: List[Violation]) -> Optional[Element]:
        element = self.elements.get(eid)
        if element is None:
            problems.append(Violation("unknown-element", f"{event} for unknown {kind} {eid}"))
            return None
        if element.kind != kind:
            problems.append(Violation("wrong-kind", f"{event} for {eid}, which is a {element.kind}, not a {kind}"))
            return None
        return element

    def _parent(self, event: NewElements, problems: List[Violation]) -> Tuple[str, Optional[Element]]:
        name = event.event_id.name
        kind = event.kind.value
        parent_id = canonical_id(event.parent_id)
        parent = self.elements.get(parent_id)
        wanted = PARENT_KIND[event.kind]
        if parent is None:
            problems.append(Violation("unknown-parent", f"{name} with unknown parent {parent_id}"))
        elif parent.kind != wanted:
            what = "the resource manager" if wanted == RM else f"a {wanted}"
            problems.append(
                Violation("wrong-parent", f"{name} with parent {parent_id}, a {parent.kind}; a {kind}'s parent is {what}")
            )
            parent = None
        return parent_id, parent

    def _new(self, event: NewElements, problems: List[Violation]) -> None:
        name = event.event_id.name
        kind = event.kind.value
        parent_id, parent = self._parent(event, problems)
        for group in event.groups:
            values = self._values(group.attributes, name, problems)
            for eid in ids_of(group.ids):
                existing = self.elements.get(eid)
                if existing is not None:
                    problems.append(Violation("duplicate-id", f"{name} for id {eid}, already a {existing.kind} in the model"))
                    if existing.kind != kind:
                        continue
                    self._set(existing, values)
                    continue
                element = Element(eid, kind, parent_id)
                self.elements[eid] = element
                self.by_kind[kind][eid] = element
                if parent is not None:
                    parent.children[eid] = None
                self._set(element, values)
                if self.reference and kind == "job" and element.sub_id in self.submitted:
                    self._check_launch(element, name, problems)

    def _new_processes(self, event: NewElements, problems: List[Violation]) -> None:
        job_id, job = self._parent(event, problems)
        if job is None:
            return
        for group in event.groups:
            values = self._values(group.attributes, "NEW_PROCESS", problems)
            self._check_ranks(job, group.ids, "NEW_PROCESS", problems)
            for rank in ids_of(group.ids):
                key = (job_id, rank)
                existing = self.elements.get(key)
                if existing is not None:
                    problems.append(Violation("duplicate-id", f"NEW_PROCESS for rank {rank} of job {job_id}, already in the model"))
                    self._set(existing, values)
                    continue
                process = Element(rank, "process", job_id)
                self.elements[key] = process
                self.by_kind["process"][key] = process
                job.children[key] = None
                self._set(process, values)

    def _check_ranks(self, job: Element, ids: Union[RangeSet, str], event: str, problems: List[Violation]) -> None:
        """Reference mode: ranks are below the job's process count, as the PTP 4.0 client indexes them."""
        if not self.reference or isinstance(ids, str) or not ids:
            return
        count_text = job.get("jobNumProcs")
        if not isinstance(count_text, str) or not is_decimal(count_text):
            problems.append(
                Violation(
                    "process-rank",
                    f"{event} for job {job.id}, whose process count (jobNumProcs) the client was not told",
                )
            )
            return
        if ids.last >= int(count_text):
            problems.append(
                Violation(
                    "process-rank",
                    f"{event} names rank {ids.last} of job {job.id}, which has {count_text} processes "
                    f"(ranks 0..{int(count_text) - 1})",
                )
            )

    def _change(self, event: ElementChange, problems: List[Violation]) -> None:
        name = event.event_id.name
        kind = RM if event.kind is None else event.kind.value
        for group in event.groups:
            values = self._values(group.attributes, name, problems)
            state = values.get(STATE_KEYS.get(kind, ""))
            for eid in ids_of(group.ids):
                element = self._expect(eid, kind, name, problems)
                if element is not None:
                    self._set(element, values)
                    if isinstance(state, str):
                        element.changed_states.append(state)
                        if self.reference and kind == "job" and element.sub_id in self.submitted:
                            self._check_launch(element, name, problems)

    def _check_launch(self, job: Element, event: str, problems: List[Violation]) -> None:
        """Reference mode, a job this client submitted: the PTP 4.0 client finishes its launch
        only on a JOB_CHANGE saying RUNNING, so its NEW_JOB must say STARTING, and a job that
        ran must have had that JOB_CHANGE by the time its end arrives."""
        state = job.state
        status = job.get("jobStatus")
        if event == "NEW_JOB":
            if state != "STARTING":
                problems.append(
                    Violation(
                        "launch-state",
                        f"NEW_JOB for job {job.id} (jobSubId {job.sub_id}), submitted by this client, says "
                        f"jobState={state}: it must say STARTING, then a JOB_CHANGE must say RUNNING "
                        "(the PTP 4.0 client's launch waits for that JOB_CHANGE)",
                    )
                )
            return
        if state == "COMPLETED" and status in RAN_STATUSES and "RUNNING" not in job.changed_states:
            problems.append(
                Violation(
                    "launch-hangs",
                    f"job {job.id} (jobSubId {job.sub_id}), submitted by this client, ended ({status}) "
                    "without a JOB_CHANGE saying RUNNING: the PTP 4.0 client's launch of it would wait until "
                    "cancelled",
                )
            )

    def _process_change(self, event: ProcessChange, problems: List[Violation]) -> None:
        job = self._expect(canonical_id(event.job_id), "job", "PROCESS_CHANGE", problems)
        if job is None:
            return
        for group in event.groups:
            output = [(OUTPUT_KEYS[k], v) for k, v in group.attributes if k in OUTPUT_KEYS]
            if self.dialect.ascii_only and len({stream for stream, _ in output}) != len(output):
                problems.append(
                    Violation(
                        "array-value",
                        f"PROCESS_CHANGE for job {job.id} repeats an output attribute in one group: the default "
                        "dialect joins a process's lines into one value",
                    )
                )
            values = self._values([(k, v) for k, v in group.attributes if k not in OUTPUT_KEYS], "PROCESS_CHANGE", problems)
            self._check_ranks(job, group.ids, "PROCESS_CHANGE", problems)
            for rank in ids_of(group.ids):
                key = (job.id, rank)
                process = self._expect(key, "process", "PROCESS_CHANGE", problems)
                if process is None:
                    continue
                self._set(process, values)
                for stream, value in output:
                    for text in value.split("\n"):
                        line = OutputLine(key, stream, text)
                        process.output.append(line)
                        job.output.append(line)

    def _remove_processes(self, event: RemoveProcesses, problems: List[Violation]) -> None:
        job = self._expect(canonical_id(event.job_id), "job", "REMOVE_PROCESS", problems)
        if job is None:
            return
        self._check_ranks(job, event.ids, "REMOVE_PROCESS", problems)
        for rank in ids_of(event.ids):
            process = self._expect((job.id, rank), "process", "REMOVE_PROCESS", problems)
            if process is not None:
                self._remove(process)

    def _remove(self, element: Element) -> None:
        key = element.key
        for child in list(element.children):
            node = self.elements.get(child)
            if node is not None and node.parent == element.id:
                self._remove(node)
        self.elements.pop(key, None)
        self.by_kind[element.kind].pop(key, None)
        parent = self.elements.get(element.parent) if element.parent is not None else None
        if parent is not None:
            parent.children.pop(key, None)
        sub = element.sub_id
        if sub is not None and self.jobs_by_sub.get(sub) is element:
            del self.jobs_by_sub[sub]
        element.removed = True

    def _values(
        self, pairs: Iterable[Tuple[str, str]], event: str = "", problems: Optional[List[Violation]] = None
    ) -> Dict[str, Union[str, List[str]]]:
        grouped: Dict[str, List[str]] = {}
        for key, value in pairs:
            grouped.setdefault(key, []).append(value)
        if problems is not None and (self.dialect.ascii_only or self.reference):
            self._check_values(grouped, event, problems)
        return {
            key: (values if len(values) > 1 or key in self._array_keys else values[0])
            for key, values in grouped.items()
        }

    def _check_values(self, grouped: Dict[str, List[str]], event: str, problems: List[Violation]) -> None:
        """Default dialect (and reference mode): the values of one group of a NEW or CHANGE event."""
        dialect = self.dialect
        for key, values in grouped.items():
            if len(values) > 1 or key in CLIENT_ARRAY_ATTRIBUTES or type_name(self.attr_defs.get(key)) == "ARRAY":
                problems.append(
                    Violation(
                        "array-value",
                        f"{event} carries {key!r} ({len(values)} value{'s' if len(values) > 1 else ''}): the default "
                        "dialect sends no multi-valued attribute in element events (the PTP 4.0 client's merge "
                        "of array values stops its event thread)",
                    )
                )
            if key in self._integer_keys:
                for value in values:
                    if dialect.integer_text(value) != value:
                        problems.append(
                            Violation(
                                "integer-range",
                                f"{event} carries {key}={value!r}: INTEGER values are plain decimal within a Java int "
                                f"({dialect.integer_bounds[0]}..{dialect.integer_bounds[1]})",  # type: ignore[index]
                            )
                        )
            if self.reference:
                definition = self.attr_defs.get(key)
                legal = getattr(definition, "values", ())
                if legal and type_name(definition) == "ENUMERATED":
                    for value in values:
                        if value not in legal:
                            problems.append(
                                Violation(
                                    "enum-value",
                                    f"{event} carries {key}={value!r}, not one of the declared values "
                                    f"({', '.join(legal)}): the PTP 4.0 client drops it",
                                )
                            )

    def _set(self, element: Element, values: Dict[str, Union[str, List[str]]]) -> None:
        element.attributes.update((k, list(v) if isinstance(v, list) else v) for k, v in values.items())
        key = STATE_KEYS.get(element.kind)
        if key is not None:
            state = values.get(key)
            if isinstance(state, str) and (not element.states or element.states[-1] != state):
                element.states.append(state)
        sub = values.get("jobSubId")
        if element.kind == "job" and isinstance(sub, str):
            self.jobs_by_sub[sub] = element


