"""The local jobs' output: read from their files as the keeper says they grow, handed to the
model line by line, with what the disk had no room for told."""

from __future__ import annotations

import logging
from typing import Dict

import trio

from .keeper_link import KeeperError
from .local_records import DROP_NOTICE_EVERY, LocalJob, OutputFile, READ_CHUNK

log = logging.getLogger("proxy_agent.schedulers.local")


class OutputReading:
    """How the local backend reads its jobs' output files."""

    def _take_dropped(self, record: LocalJob, dropped: Dict[str, list]) -> None:
        """The keeper's totals of output the disk had no room for: what is new is told to the
        client where it happened in the stream (see :meth:`_read`), and to every client once
        in a while."""
        grew = False
        for name, (size, lines, at) in dropped.items():
            rank_text, _, stream = name.partition(".")
            file = record.files.get((int(rank_text), stream))
            if file is None or size <= file.dropped[0]:
                continue
            file.gaps.append([int(at), int(size) - file.dropped[0], int(lines) - file.dropped[1]])
            file.dropped = [int(size), int(lines)]
            grew = True
            self._mark(record.key, int(rank_text), stream)
        now = trio.current_time()
        if grew and (self._drops_told_at is None or now - self._drops_told_at >= DROP_NOTICE_EVERY):
            self._drops_told_at = now
            self.context.notify("WARNING", f"the disk of {self._directory} has no room for the output of local jobs: "
                                           "what does not fit is dropped (each process's output says how much), the "
                                           "jobs run on, and new local jobs are refused until there is room")

    def _mark(self, key: int, rank: int, stream: str) -> None:
        self._dirty[(key, rank, stream)] = None
        self._wake_reader.set()

    async def _read_outputs(self) -> None:
        """Read the output files the keeper said grew, as far as the clients have room."""
        model = self.model
        async with trio.open_nursery() as nursery:
            self._nursery_for_tasks = nursery
            while True:
                if not self._dirty:
                    await self._wake_reader.wait()
                    self._wake_reader = trio.Event()
                    continue
                if not model.output_room_available():
                    await model.output_room()
                key, rank, stream = next(iter(self._dirty))
                del self._dirty[(key, rank, stream)]
                record = self._jobs.get(key)
                if record is None:
                    continue
                self._read(record, rank, stream, READ_CHUNK)
                await trio.lowlevel.checkpoint()

    def _read(self, record: LocalJob, rank: int, stream: str, limit: int, final: bool = False) -> None:
        """Read a file on (``limit`` bytes at most; to its end when ``final``) and hand its
        complete lines to the model; tell the keeper how far it has been read."""
        file = record.files[(rank, stream)]
        process = record.process_keys[rank]
        model = self.model
        while True:
            if file.gaps:
                self._tell_gap(file, process, stream)
            step = limit
            if file.gaps and file.gaps[0][0] > file.offset:
                step = min(limit, file.gaps[0][0] - file.offset)  # up to the gap, then the note
            data = file.read(step)
            if data is None:
                if file.gaps and final:
                    self._tell_gap(file, process, stream, anyway=True)
                return
            if data:
                text = file.splitter.feed_text(data)
                if text is not None and process in model:
                    model.output(process, stream, text, file.consumed)
            if file.gaps and file.gaps[0][0] <= file.offset:
                continue
            if not data or len(data) < step or not final:
                break
        if file.gaps and final:
            self._tell_gap(file, process, stream, anyway=True)
        if final:
            text = file.splitter.flush_text()
            if text is not None and process in model:
                model.output(process, stream, text, file.offset)
        elif file.offset < file.size:
            self._mark(record.key, rank, stream)
        if self._keeper is not None and not self._keeper.closed and not self._closing:
            self._spawn_soon(self._keeper_read, record.key, rank, stream, file.offset)

    def _tell_gap(self, file: OutputFile, process: int, stream: str, anyway: bool = False) -> None:
        """Where output was dropped for want of disk space, say so, in order: the lines
        before the gap, then a note on the process's stderr."""
        while file.gaps and (anyway or file.gaps[0][0] <= file.offset):
            _at, size, lines = file.gaps.pop(0)
            if process not in self.model:
                continue
            before = file.splitter.flush_text()
            if before is not None:
                self.model.output(process, stream, before, file.offset)
            self.model.output(process, "stderr", f"[proxy-agent: {lines} lines ({size} bytes) of {stream} were dropped "
                                                  f"here: the disk of {self._directory} had no room for them]")

    async def _keeper_read(self, key: int, rank: int, stream: str, offset: int) -> None:
        if self._keeper is not None and not self._keeper.closed:
            try:
                await self._keeper.send({"op": "read", "key": key, "rank": rank, "stream": stream, "offset": offset})
            except KeeperError:
                pass
