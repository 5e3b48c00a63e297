"""A job's attributes as SUBMIT_JOB arguments, and a job's kept output as the agent gives it."""

from __future__ import annotations

from typing import Any, Iterable, List, Mapping, Optional, Union

import attrs


def attribute_text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def job_attributes(
    exec_path: Optional[str],
    args: Iterable[str] = (),
    *,
    count: int = 1,
    env: Union[Mapping[str, str], Iterable[str], None] = None,
    cwd: Optional[str] = None,
    queue: Optional[str] = None,
    sub_id: str,
    **attributes: Any,
) -> List[str]:
    """SUBMIT_JOB arguments for a job (``key=value`` strings, ARRAY attributes repeated).

    ``exec_path`` with a '/' goes in ``execPath`` (the program's path), a bare
    name in ``execName`` (looked up on the agent's PATH).  Extra keyword
    attributes pass through (``execName=...`` too, to send both); list values
    repeat the key.
    """
    out = [f"jobSubId={sub_id}"]
    if exec_path:
        out.append(("execPath=" if "/" in exec_path else "execName=") + exec_path)
    out.extend(f"progArgs={arg}" for arg in args)
    if env:
        items = env.items() if isinstance(env, Mapping) else (item.partition("=")[::2] for item in env)
        out.extend(f"env={name}={value}" for name, value in items)
    if cwd:
        out.append(f"workingDir={cwd}")
    if count != 1:
        out.append(f"jobNumProcs={int(count)}")
    if queue is not None:
        out.append(f"queueId={queue}")
    for key, value in attributes.items():
        if isinstance(value, (list, tuple)):
            out.extend(f"{key}={attribute_text(v)}" for v in value)
        elif value is not None:
            out.append(f"{key}={attribute_text(value)}")
    return out


@attrs.define
class KeptStream:
    """What one process wrote to one stream, as the agent keeps it: ``lines`` from the line
    numbered ``first``, and how many later lines it did not keep (past its bound per job)."""

    rank: int
    stream: str
    first: int
    lines: List[str]
    dropped: int = 0


@attrs.define
class KeptOutput:
    """A job's kept output (:meth:`AgentClient.kept_output`): its streams, by rank, stdout first."""

    key: Optional[int]
    streams: List[KeptStream]

    def text(self, stream: str = "stdout", rank: Optional[int] = None) -> str:
        """The lines of one stream, every process's (rank by rank) or one's, each ending in a newline."""
        return "".join(line + "\n" for part in self.streams
                       if part.stream == stream and (rank is None or part.rank == rank) for line in part.lines)

    def dropped(self, stream: Optional[str] = None) -> int:
        return sum(part.dropped for part in self.streams if stream is None or part.stream == stream)


