"""The description of a co-allocated multi-part job, in its two written forms.

A multi-part job is a list of *parts*; each part is one ordinary job for one scheduler
(``scheduler:queue``, or a queue name the service routes), started with ``count``
processes.  Every part says how it takes part in the start barrier (``start_type``) and in
the communication between parts (``comms_type``).  The job as a whole says how the barrier
is released and may carry a name.

The same :class:`MultiJobDescription` is written in two forms:

JSON
    ``{"name": ..., "barrier_release": "auto"|"explicit", "forward_rendezvous": false,
    "parts": [{"queue": "slurm:debug", "count": 2, "executable": "/bin/app", "arguments":
    ["-x", "1"], "environment": {"A": "1"}, "label": "sub1", "start_type":
    "strict-barrier", "comms_type": "blocking-join"}, ...]}``; a bare list of parts is a
    job with default options.  Unknown keys are refused.

The multi-request form
    the resource specification language co-allocator users know::

        +( &(resourceManagerContact="slurm:debug")(count=2)(executable="/bin/app")
            (arguments="-x" "1")(environment=(A "1"))(label="sub1")
            (subjobStartType=strict-barrier)(subjobCommsType=blocking-join) )
         ( &(executable=/bin/other) )

    Job options go in a conjunction around the multi-request:
    ``&(name=demo)(barrierRelease=explicit)( +(&(...))(&(...)) )``.

    Lexical rules: attribute names ignore case and underscores (``subjob_start_type`` is
    ``subjobStartType``); a value is an unquoted word (any characters but white space and
    ``+&|()=<>!"'^#$``), a string in ``"..."`` or ``'...'`` in which the quote is written
    twice to stand for itself, or ``^C...C`` quoted by a character ``C`` of one's choice;
    ``a # b`` concatenates; ``$(NAME)`` is replaced by the value ``rslSubstitution``
    gives ``NAME`` earlier in the same conjunction or an enclosing one; ``(* ... *)`` is
    a comment.

Both parsers check every value and raise :class:`DescriptionError` naming the part (index
and label), the field and, for the multi-request form, the line and column.  Nothing here
does I/O.
"""

from __future__ import annotations

from typing import Union

from .json_form import parse_json, parse_part_json, render_json
from .parts import (
    MAX_COUNT, MAX_DESCRIPTION_SIZE, MAX_PARTS, BarrierRelease, CommsType, DescriptionError, MultiJobDescription, Part,
    StartType,
)
from .rsl import parse_part_rsl, parse_rsl, render_part_rsl, render_rsl

# The description's face: every name its users need, from one place (the forms live in
# json_form and rsl, the data and its checks in parts).
__all__ = [
    "BarrierRelease",
    "CommsType",
    "DescriptionError",
    "MAX_COUNT",
    "MAX_DESCRIPTION_SIZE",
    "MAX_PARTS",
    "MultiJobDescription",
    "Part",
    "StartType",
    "parse_description",
    "parse_json",
    "parse_part_json",
    "parse_part_rsl",
    "parse_rsl",
    "render_json",
    "render_part_rsl",
    "render_rsl",
]


def parse_description(text: Union[str, bytes]) -> MultiJobDescription:
    """A multi-part job in either form: JSON when it starts with ``{`` or ``[``, else the
    multi-request form."""
    head = text.lstrip()[:1]
    if head in ("{", "[", b"{", b"["):
        return parse_json(text)
    return parse_rsl(text)


