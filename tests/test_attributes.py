"""Tests for proxy_agent.protocol.attributes."""

from __future__ import annotations

import pickle
import string

import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxy_agent.protocol.attributes import (
    DATE_STYLES,
    INT32_MAX,
    INT32_MIN,
    STANDARD_ATTRIBUTES,
    A,
    AttributeDefinition,
    AttributeRegistry,
    AttributeSet,
    AttributeValueError,
    AttrType,
    decode_attr_defs,
    encode_attr_defs,
    format_attribute,
    split_attribute,
    standard_registry,
)

# --------------------------------------------------------------------------- strategies

ids = st.text(alphabet=string.ascii_letters + string.digits + "_.-", min_size=1, max_size=16)
texts = st.text(max_size=24)
texts_without_nul = st.text(alphabet=st.characters(blacklist_characters="\0"), max_size=24)
int32 = st.integers(INT32_MIN, INT32_MAX)
finite = st.floats(allow_nan=False, allow_infinity=False)
epochs = st.integers(-(10**9), 4 * 10**9)


@st.composite
def definitions(draw, kind=None):
    kind = draw(st.sampled_from(list(AttrType))) if kind is None else kind
    fields = {}
    default = ""
    if kind is AttrType.INTEGER:
        if draw(st.booleans()):
            low, high = sorted(draw(st.tuples(int32, int32)))
            fields.update(minimum=str(low), maximum=str(high))
        else:
            low, high = INT32_MIN, INT32_MAX
        if draw(st.booleans()):
            default = str(draw(st.integers(low, high)))
    elif kind is AttrType.BIGINTEGER:
        big = st.integers(-(10**40), 10**40)
        low, high = sorted(draw(st.tuples(big, big)))
        if draw(st.booleans()):
            fields.update(minimum=str(low), maximum=str(high))
        if draw(st.booleans()):
            default = str(draw(st.integers(low, high)))
    elif kind is AttrType.DOUBLE:
        if draw(st.booleans()):
            low, high = sorted(draw(st.tuples(finite, finite)))
            fields.update(minimum=repr(low), maximum=repr(high))
            value = draw(st.floats(min_value=low, max_value=high))
        else:
            value = draw(finite)
        if draw(st.booleans()):
            default = repr(value)
    elif kind is AttrType.ENUMERATED:
        values = draw(st.lists(texts_without_nul, min_size=1, max_size=6, unique=True))
        fields["values"] = tuple(values)
        default = draw(st.sampled_from(values + [""]))
    elif kind is AttrType.DATE:
        fields.update(
            date_style=draw(st.sampled_from(DATE_STYLES)),
            time_style=draw(st.sampled_from(DATE_STYLES)),
            locale=draw(st.sampled_from(["en_US", "US", "UK", "de_DE"])),
        )
        low, high = -(10**9), 4 * 10**9
        if draw(st.booleans()):
            low, high = sorted(draw(st.tuples(epochs, epochs)))
            fields.update(minimum=str(low), maximum=str(high))
        if draw(st.booleans()):
            default = str(draw(st.integers(low, high)))
    elif kind is AttrType.BOOLEAN:
        default = draw(st.sampled_from(["", "true", "false", "TRUE", "False"]))
    else:
        default = draw(texts_without_nul)
    return AttributeDefinition(
        draw(ids), kind, draw(texts), draw(texts), draw(st.booleans()), default, **fields
    )


def integer(**kw):
    return AttributeDefinition("n", AttrType.INTEGER, "N", **kw)


# --------------------------------------------------------------------------- wire form


def test_to_args_layout_per_type():
    assert integer().to_args() == ["6", "n", "INTEGER", "N", "", "true", ""]
    assert integer(minimum="1", maximum="9", default="3").to_args() == [
        "8", "n", "INTEGER", "N", "", "true", "3", "1", "9",
    ]
    # A lone bound is enforced locally but cannot travel: the wire wants a pair.
    assert integer(minimum="1").to_args() == ["6", "n", "INTEGER", "N", "", "true", ""]
    state = AttributeDefinition(
        "s", AttrType.ENUMERATED, "S", "desc", False, "UP", values=("UP", "DOWN")
    )
    assert state.to_args() == ["8", "s", "ENUMERATED", "S", "desc", "false", "UP", "UP", "DOWN"]
    date = AttributeDefinition("d", AttrType.DATE, "D")
    assert date.to_args() == ["9", "d", "DATE", "D", "", "true", "", "SHORT", "SHORT", "en_US"]
    bounded = AttributeDefinition("d", AttrType.DATE, "D", minimum="0", maximum="100", locale="US")
    assert bounded.to_args()[-5:] == ["SHORT", "SHORT", "US", "0", "100"]
    assert bounded.to_args()[0] == "11"
    for kind in (AttrType.STRING, AttrType.ARRAY, AttrType.BOOLEAN):
        assert AttributeDefinition("x", kind, "X").to_args()[0] == "6"


def test_type_accepts_wire_spelling():
    assert AttributeDefinition("x", "STRING", "X").type is AttrType.STRING
    assert [t.value for t in AttrType] == [t.name for t in AttrType]
    with pytest.raises(ValueError):
        AttributeDefinition("x", "TEXT", "X")


@given(definitions())
def test_definition_round_trip(defn):
    args = defn.to_args()
    assert int(args[0]) == len(args) - 1
    prefix = ["junk", "more junk"]
    parsed, end = AttributeDefinition.from_args(prefix + args + ["tail"], len(prefix))
    assert parsed == defn
    assert end == len(prefix) + len(args)


@pytest.mark.parametrize("kind", list(AttrType))
@given(data=st.data())
def test_definition_round_trip_for_every_type(kind, data):
    defn = data.draw(definitions(kind))
    assert AttributeDefinition.from_args(defn.to_args(), 0) == (defn, len(defn.to_args()))


@given(st.lists(definitions(), max_size=6))
def test_encode_decode_round_trip(defs):
    args = encode_attr_defs(defs)
    assert args[0] == str(len(defs))
    assert decode_attr_defs(args) == defs


def test_display_is_read_case_insensitively():
    args = ["6", "x", "STRING", "X", "", "TRUE", ""]
    assert AttributeDefinition.from_args(args, 0)[0].display is True
    args[5] = "False"
    assert AttributeDefinition.from_args(args, 0)[0].display is False


MALFORMED = [
    ([], "no arguments"),
    (["x"], "not a decimal count"),
    (["-1"], "not a decimal count"),
    (["1"], "only 0 are present"),
    (["2", "6", "x", "STRING", "X", "", "true", ""], "only 1 are present"),
    (["0", "extra"], "1 trailing"),
    (["1", "6", "x", "STRING", "X", "", "true", "", "extra"], "1 trailing"),
    (["1", "5", "x", "STRING", "X", "", "true"], "at least 6"),
    (["1", "9", "x", "STRING", "X", "", "true", ""], "only 6 arguments follow"),
    (["1", "6", "x", "TEXT", "X", "", "true", ""], "unknown attribute type"),
    (["1", "6", "x", "STRING", "X", "", "yes", ""], "DISPLAY"),
    (["1", "7", "x", "STRING", "X", "", "true", "", "extra"], "no extras"),
    (["1", "7", "n", "INTEGER", "N", "", "true", "0", "1"], "MIN MAX"),
    (["1", "6", "e", "ENUMERATED", "E", "", "true", ""], "at least one value"),
    (["1", "8", "d", "DATE", "D", "", "true", "", "SHORT", "SHORT"], "DATE_STYLE"),
    (["1", "9", "d", "DATE", "D", "", "true", "", "SHORT", "TINY", "US"], "time_style"),
    (["1", "6", "n", "INTEGER", "N", "", "true", "zero"], "not an integer"),
    (["1", "8", "n", "INTEGER", "N", "", "true", "0", "5", "1"], "above maximum"),
    (["1", "8", "n", "INTEGER", "N", "", "true", "0", "1", "x"], "not an integer"),
    (["1", "7", "e", "ENUMERATED", "E", "", "true", "B", "A"], "not one of"),
    (["1", "6", "=x", "STRING", "X", "", "true", ""], "'='"),
]


@pytest.mark.parametrize("args,fragment", MALFORMED)
def test_decode_rejects_malformed_definitions(args, fragment):
    with pytest.raises(ValueError) as info:
        decode_attr_defs(args)
    assert fragment in str(info.value)


def test_from_args_position_errors():
    with pytest.raises(ValueError):
        AttributeDefinition.from_args(["6"], 3)
    with pytest.raises(ValueError):
        AttributeDefinition.from_args([], 0)


# --------------------------------------------------------------------------- definitions


def test_definition_construction_rules():
    with pytest.raises(ValueError):
        AttributeDefinition("e", AttrType.ENUMERATED, "E")  # no values
    with pytest.raises(ValueError):
        AttributeDefinition("e", AttrType.ENUMERATED, "E", values=("A", "A"))
    with pytest.raises(AttributeValueError):
        AttributeDefinition("e", AttrType.ENUMERATED, "E", default="C", values=("A", "B"))
    assert AttributeDefinition("e", AttrType.ENUMERATED, "E", values=("A",)).default == ""
    with pytest.raises(ValueError):
        AttributeDefinition("s", AttrType.STRING, "S", values=("A",))
    with pytest.raises(ValueError):
        AttributeDefinition("s", AttrType.STRING, "S", minimum="1", maximum="2")
    with pytest.raises(ValueError):
        integer(minimum="5", maximum="1")
    with pytest.raises(AttributeValueError):
        integer(minimum="one")
    with pytest.raises(AttributeValueError):
        integer(default="abc")
    with pytest.raises(AttributeValueError):
        integer(default="0", minimum="1")
    with pytest.raises(ValueError):
        AttributeDefinition("d", AttrType.DATE, "D", date_style="TINY")
    for bad_id in ("", "a=b", "a b", "a\0"):
        with pytest.raises(ValueError):
            AttributeDefinition(bad_id, AttrType.STRING, "S")
    with pytest.raises(TypeError):
        AttributeDefinition("s", AttrType.STRING, "S", display="yes")  # type: ignore[arg-type]


def _accepts(defn, value, expected=None):
    result = defn.validate(value)
    assert result == (value if expected is None else expected)
    assert defn.validate(result) == result  # normalizing is idempotent


def _rejects(defn, value):
    with pytest.raises(AttributeValueError) as info:
        defn.validate(value)
    assert repr(defn.id) in str(info.value)
    return str(info.value)


INTEGER_OK = [("0", "0"), ("42", "42"), ("+7", "7"), ("-13", "-13"), ("007", "7"), ("-0", "0"),
              (str(INT32_MAX), None), (str(INT32_MIN), None)]
INTEGER_BAD = ["", "1.0", "1e3", " 1", "1 ", "1_000", "0x10", "--1", "+", "one", "\u0661",
               str(INT32_MAX + 1), str(INT32_MIN - 1), "9" * 50]


@pytest.mark.parametrize("value,expected", INTEGER_OK)
def test_integer_accepts(value, expected):
    _accepts(integer(), value, expected)


@pytest.mark.parametrize("value", INTEGER_BAD)
def test_integer_rejects(value):
    _rejects(integer(), value)


def test_integer_bounds():
    defn = integer(minimum="1", maximum="10")
    _accepts(defn, "1")
    _accepts(defn, "10")
    assert "minimum" in _rejects(defn, "0")
    assert "maximum" in _rejects(defn, "11")
    lone = integer(minimum="1")
    _accepts(lone, "999999")
    _rejects(lone, "0")


DOUBLE = AttributeDefinition("load", AttrType.DOUBLE, "Load")
DOUBLE_OK = [("1.5", "1.5"), ("-2", "-2.0"), ("1e3", "1000.0"), (".5", "0.5"), ("5.", "5.0"),
             ("+0.25", "0.25"), ("1E-3", "0.001"), ("1e+16", "1e+16")]
DOUBLE_BAD = ["", "nan", "NaN", "inf", "-Infinity", "1e999", "1_0.5", " 1.5", "1.5 ", "1,5",
              "0x1p3", ".", "e5", "\u0661.5", "1.5f"]


def test_big_integer_has_no_32_bit_limit_but_is_still_plain_decimal():
    big = AttributeDefinition("mem", AttrType.BIGINTEGER, "Memory", minimum="0", maximum=str(2**80))
    assert big.validate("4294967294") == "4294967294"
    assert big.validate("+0018446744073709551615") == "18446744073709551615"
    assert big.to_args()[7:] == ["0", str(2**80)]
    for bad in ("1_0", "\u0661", " 1", "1.5", "9" * 101):
        with pytest.raises(AttributeValueError):
            big.validate(bad)
    with pytest.raises(AttributeValueError, match="below the minimum"):
        big.validate("-1")
    (back,) = decode_attr_defs(encode_attr_defs([big]))
    assert back == big


@pytest.mark.parametrize("value,expected", DOUBLE_OK)
def test_double_accepts(value, expected):
    _accepts(DOUBLE, value, expected)


@pytest.mark.parametrize("value", DOUBLE_BAD)
def test_double_rejects(value):
    _rejects(DOUBLE, value)


def test_double_bounds():
    defn = AttributeDefinition("f", AttrType.DOUBLE, "F", minimum="0", maximum="1.5")
    _accepts(defn, "1.5")
    _accepts(defn, "0", "0.0")
    _rejects(defn, "-0.1")
    _rejects(defn, "1.6")


BOOLEAN = AttributeDefinition("flag", AttrType.BOOLEAN, "Flag")


@pytest.mark.parametrize("value,expected", [("true", "true"), ("FALSE", "false"), ("True", "true")])
def test_boolean_accepts(value, expected):
    _accepts(BOOLEAN, value, expected)


@pytest.mark.parametrize("value", ["", "yes", "1", "0", "t", " true", "truee"])
def test_boolean_rejects(value):
    _rejects(BOOLEAN, value)


STATE = AttributeDefinition("st", AttrType.ENUMERATED, "St", values=("UP", "DOWN"))


def test_enumerated_is_exact():
    _accepts(STATE, "UP")
    _accepts(STATE, "DOWN")
    for bad in ("up", "", " UP", "UNKNOWN"):
        message = _rejects(STATE, bad)
        assert "'UP'" in message and "'DOWN'" in message


DATE = AttributeDefinition("when", AttrType.DATE, "When")
DATE_OK = ["2024-01-02", "2024-01-02T03:04:05", "2024-01-02 03:04:05", "2024-01-02T03:04:05+02:00",
           "2024-01-02T03:04:05.123456", "2024-01-02T03:04:05Z", "0", "1700000000", "-5"]
DATE_BAD = ["", "yesterday", "2024-13-01", "2024-01-32", "01/02/2024", "1.5", "+5",
            "\u0661\u0667\u0660\u0660", "2024-01-02T25:00:00", "9" * 40]


@pytest.mark.parametrize("value", DATE_OK)
def test_date_accepts(value):
    _accepts(DATE, value)


@pytest.mark.parametrize("value", DATE_BAD)
def test_date_rejects(value):
    _rejects(DATE, value)


def test_date_bounds_mix_epoch_and_iso():
    defn = AttributeDefinition(
        "when", AttrType.DATE, "When", minimum="2020-01-01T00:00:00Z", maximum="1893456000"
    )
    _accepts(defn, "2024-06-01")
    _accepts(defn, "1600000000")  # 2020-09-13
    assert "minimum" in _rejects(defn, "2019-12-31T23:59:59")
    assert "maximum" in _rejects(defn, "2030-01-01T00:00:01+00:00")


@pytest.mark.parametrize("kind", [AttrType.STRING, AttrType.ARRAY])
def test_string_and_array_accept_any_text_but_nul(kind):
    defn = AttributeDefinition("s", kind, "S")
    for value in ("", " spaced ", "a=b", "ünïcødé", "line\nbreak", "-a 2 -b 4"):
        _accepts(defn, value)
    assert "NUL" in _rejects(defn, "a\0b")


def test_validate_rejects_non_strings():
    _rejects(integer(), 5)  # type: ignore[arg-type]


def test_error_message_names_id_value_and_reason():
    with pytest.raises(AttributeValueError) as info:
        integer().validate("twelve")
    err = info.value
    assert err.attr_id == "n" and err.value == "twelve"
    assert str(err) == "attribute 'n': value 'twelve' is not an integer (optional sign, then ASCII digits)"
    assert isinstance(err, ValueError)
    copy = pickle.loads(pickle.dumps(err))
    assert str(copy) == str(err)


def test_error_message_truncates_long_values():
    long_value = "x" * 10_000
    message = _rejects(integer(), long_value)
    assert len(message) < 300
    assert "10000 chars" in message


# --------------------------------------------------------------------------- key=value


@pytest.mark.parametrize(
    "arg,expected",
    [
        ("a=b", ("a", "b")),
        ("a=", ("a", "")),
        ("a=b=c", ("a", "b=c")),
        ("env=PATH=/bin:/usr/bin", ("env", "PATH=/bin:/usr/bin")),
        ("progArgs=-a 2 -b 4", ("progArgs", "-a 2 -b 4")),
        ("ключ=значение", ("ключ", "значение")),
        ("k==", ("k", "=")),
        (" k = v ", (" k ", " v ")),
        ("k=line\nbreak", ("k", "line\nbreak")),
    ],
)
def test_split_attribute(arg, expected):
    assert split_attribute(arg) == expected


@pytest.mark.parametrize("arg,why", [("a", "no '='"), ("", "no '='"), ("=a", "empty key"), ("=", "empty key")])
def test_split_attribute_rejects(arg, why):
    with pytest.raises(AttributeValueError) as info:
        split_attribute(arg)
    assert why in str(info.value)
    assert repr(arg) in str(info.value)


def test_format_attribute():
    assert format_attribute("env", "PATH=/bin") == "env=PATH=/bin"
    assert format_attribute("k", "") == "k="
    with pytest.raises(AttributeValueError):
        format_attribute("", "v")
    with pytest.raises(AttributeValueError):
        format_attribute("a=b", "v")
    with pytest.raises(TypeError):
        format_attribute("k", 5)  # type: ignore[arg-type]


@given(st.text(min_size=1).filter(lambda k: "=" not in k), st.text())
def test_format_split_round_trip(key, value):
    assert split_attribute(format_attribute(key, value)) == (key, value)


# --------------------------------------------------------------------------- AttributeSet


def test_attribute_set_repeated_keys():
    attrs = AttributeSet.parse(
        ["execName=a.out", "progArgs=-v", "progArgs=x=1", "jobSubId=JOB_1", "progArgs=", "execName=b.out"]
    )
    assert attrs.get("progArgs") == ""
    assert attrs.getall("progArgs") == ["-v", "x=1", ""]
    assert attrs.get("execName") == "b.out"
    assert attrs.getall("execName") == ["a.out", "b.out"]
    assert attrs.get("missing") is None
    assert attrs.get("missing", "dflt") == "dflt"
    assert attrs.getall("missing") == []
    assert "jobSubId" in attrs and "missing" not in attrs
    assert attrs.keys() == ["execName", "progArgs", "jobSubId"]
    assert attrs.to_args()[2] == "progArgs=x=1"


def test_attribute_set_construction():
    assert AttributeSet().items == ()
    assert AttributeSet([["a", "1"]]).items == (("a", "1"),)
    with pytest.raises(AttributeValueError):
        AttributeSet.parse(["novalue"])
    with pytest.raises(AttributeValueError):
        AttributeSet([("a=b", "c")])
    with pytest.raises(TypeError):
        AttributeSet([("a", 1)])
    assert AttributeSet.parse(["a=1"]) == AttributeSet((("a", "1"),))


@given(st.lists(st.tuples(st.text(min_size=1).filter(lambda k: "=" not in k), st.text()), max_size=10))
def test_attribute_set_args_round_trip(items):
    attrs = AttributeSet(items)
    assert AttributeSet.parse(attrs.to_args()) == attrs


# --------------------------------------------------------------------------- registry


def test_registry_basics():
    reg = AttributeRegistry([integer()])
    assert "n" in reg and "m" not in reg
    assert reg.get("n") == integer() and reg.get("m") is None
    assert len(reg) == 1 and list(reg) == [integer()] and reg.definitions() == [integer()]
    with pytest.raises(ValueError):
        reg.add(integer(default="3"))
    with pytest.raises(TypeError):
        reg.add("n")  # type: ignore[arg-type]


def test_registry_validate():
    reg = standard_registry()
    good = AttributeSet.parse(
        ["jobSubId=JOB_1", "progArgs=-v", "progArgs=-x", "env=A=1", "env=B=2", "jobNumProcs=4", "custom=1"]
    )
    assert reg.validate(good) == []
    errors = reg.validate(good, allow_unknown=False)
    assert errors == ["unknown attribute 'custom'"]
    bad = AttributeSet.parse(
        ["jobState=RUNNING", "jobState=DONE", "jobNumProcs=0", "execName=a", "execName=b", "x=1", "x=2"]
    )
    errors = reg.validate(bad, allow_unknown=False)
    assert len(errors) == 5, errors
    assert any("'jobState'" in e and "2 times" in e for e in errors)
    assert any("'jobState'" in e and "'DONE'" in e for e in errors)
    assert any("'jobNumProcs'" in e and "minimum" in e for e in errors)
    assert any("'execName'" in e and "2 times" in e for e in errors)
    assert errors.count("unknown attribute 'x'") == 1


# --------------------------------------------------------------------------- standard ids

REFERENCE_IDS = """
    id name machineState numNodes nodeState nodeNumber queueState
    jobId jobSubId jobState jobStatus jobStatusMessage queueId jobNumProcs execName execPath
    workingDir progArgs env userId
    processState processStatus processPID processIndex processNodeId processStdout
    processStderr processExitCode processSignalName
""".split()


def test_standard_attributes_cover_the_reference_ids():
    by_id = {d.id: d for d in STANDARD_ATTRIBUTES}
    assert len(by_id) == len(STANDARD_ATTRIBUTES)
    assert sorted(by_id) == sorted(REFERENCE_IDS)
    constants = {v for k, v in vars(A).items() if k.isupper()}
    assert set(REFERENCE_IDS) <= constants


def test_standard_attribute_types():
    by_id = {d.id: d for d in STANDARD_ATTRIBUTES}
    states = {
        "machineState": ("UP", "DOWN", "ALERT", "ERROR", "UNKNOWN"),
        "nodeState": ("UP", "DOWN", "ERROR", "UNKNOWN"),
        "queueState": ("NORMAL", "STOPPED"),
        "jobState": ("STARTING", "RUNNING", "SUSPENDED", "COMPLETED"),
        "processState": ("STARTING", "RUNNING", "SUSPENDED", "COMPLETED"),
    }
    integers = {"numNodes", "nodeNumber", "jobNumProcs", "processPID", "processIndex", "processExitCode"}
    arrays = {"progArgs", "env"}
    for attr_id, defn in by_id.items():
        if attr_id in states:
            assert defn.type is AttrType.ENUMERATED and defn.values == states[attr_id]
            assert defn.default in defn.values  # the IDE insists on a legal default
        elif attr_id in integers:
            assert defn.type is AttrType.INTEGER
            assert defn.validate(defn.default) == defn.default  # the IDE parses it
        elif attr_id in arrays:
            assert defn.type is AttrType.ARRAY
        else:
            assert defn.type is AttrType.STRING, attr_id
        assert defn.name and defn.description
    procs = by_id["jobNumProcs"]
    assert procs.minimum == "1" and procs.to_args()[-2:] == ["1", str(INT32_MAX)]
    with pytest.raises(AttributeValueError):
        procs.validate("0")


def test_standard_attributes_round_trip():
    assert decode_attr_defs(encode_attr_defs(STANDARD_ATTRIBUTES)) == list(STANDARD_ATTRIBUTES)
    assert standard_registry() is not standard_registry()
    assert standard_registry().definitions() == list(STANDARD_ATTRIBUTES)
