"""Descriptions of the attributes a backend shows and accepts, in neutral terms.

A backend lists an :class:`AttrInfo` for every attribute it puts on elements beyond the
standard ones and for every setting a submission may carry.  Front-ends turn these into
whatever their protocol uses to describe attributes (PTP: ATTR_DEF definitions).
"""

from __future__ import annotations

import enum
from typing import Optional, Tuple

import attrs

__all__ = ["AttrInfo", "ValueType"]


def _as_tuple(values):  # unannotated: the field's own type stays the one __init__ shows
    """Field converter: a tuple of the values.  (A function of ours rather than ``tuple``:
    attrs reads a converter's signature, and the first built-in's costs start-up milliseconds.)"""
    return tuple(values)


class ValueType(enum.Enum):
    STRING = "string"
    INTEGER = "integer"
    #: an integer that may exceed 32 bits (memory in bytes, large counts)
    BIGINTEGER = "biginteger"
    DOUBLE = "double"
    BOOLEAN = "boolean"
    #: one of ``choices``
    ENUMERATED = "enumerated"
    #: a point in time, ``YYYY-MM-DDTHH:MM:SS`` local time
    DATE = "date"
    #: several texts (a job's arguments)
    LIST = "list"
    #: the key of another element
    REFERENCE = "reference"


@attrs.frozen
class AttrInfo:
    """One attribute: its neutral ``name``, what it holds and how to show it.

    ``label`` is a short human name, ``description`` one sentence.  ``default`` is the value
    assumed when absent (text; ``""`` for none).  ``minimum``/``maximum`` bound numbers;
    ``choices`` lists the legal values of an ENUMERATED one.  ``settable`` marks a setting a
    submission may carry; ``display`` whether a user interface should show it.
    """

    name: str
    type: ValueType
    label: str
    description: str
    default: str = ""
    minimum: Optional[str] = None
    maximum: Optional[str] = None
    choices: Tuple[str, ...] = attrs.field(default=(), converter=_as_tuple)
    settable: bool = False
    display: bool = True
