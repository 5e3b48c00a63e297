"""Invoke Server protocol, byte level: request lines -> events, replies and notifies -> bytes."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy_agent.frontends.invoke.protocol import (
    MAX_CREATE_BYTES,
    MAX_LINE_BYTES,
    CreateInterrupted,
    CreateNotify,
    EndOfInput,
    Exit,
    InputWarning,
    InvokeStatus,
    JobCreate,
    JobDestroy,
    JobStatus,
    QueryFeatures,
    RequestError,
    RequestReader,
    StatusNotify,
    check_job_id,
    encode_job_create,
    encode_request,
    notify_create_failed,
    notify_created,
    notify_status,
    one_line,
    parse_notify,
    reply_failure,
    reply_features,
    reply_success,
)
from proxy_agent.frontends.invoke.protocol import ReaderState

# The whole exchange of the real client, as the facts sheet gives it.
FACTS_ATTRIBUTES = (
    ("hostname", "localhost"),
    ("port", "0"),
    ("client_name", "localhost"),
    ("executable_path", "/opt/app/bin/_stub_pi_trial"),
    ("backend", "NORMAL"),
    ("count", "1"),
    ("staging", "false"),
    ("argument", "--connectbackAddress=ng_tcp://localhost:57007/"),
    ("argument", "--authNumber=1812930085"),
    ("argument", "--contextID=1"),
    ("argument", "--jobID=1"),
    ("argument", "--heartbeat=60"),
    ("argument", "--connectRetry=4,1,2,random"),
    ("argument", "--tcpNodelay=0"),
    ("work_directory", "/opt/app"),
    ("redirect_enable", "true"),
    ("stdout_file", "/tmp/ngtmpfile.o9UguW"),
    ("stderr_file", "/tmp/ngtmpfile.i7T1TH"),
    ("status_polling", "0"),
    ("refresh_credential", "0"),
)
FACTS_REQUEST_LINES = (
    ["QUERY_FEATURES", "JOB_CREATE 1"]
    + [f"{name} {value}" for name, value in FACTS_ATTRIBUTES]
    + ["JOB_CREATE_END", "JOB_DESTROY job-1", "EXIT"]
)
FACTS_REQUESTS = b"".join(line.encode() + b"\r\n" for line in FACTS_REQUEST_LINES)
FACTS_EVENTS = [QueryFeatures(), JobCreate("1", FACTS_ATTRIBUTES, "JOB_CREATE_END"), JobDestroy("job-1"), Exit()]
FACTS_REPLIES = (
    b"SM\r\n"
    b"protocol_version 2.0\r\n"
    b"request JOB_CREATE\r\n"
    b"request JOB_STATUS\r\n"
    b"request JOB_DESTROY\r\n"
    b"request QUERY_FEATURES\r\n"
    b"request EXIT\r\n"
    b"REPLY_END\r\n"
    b"S\r\n"
    b"S\r\n"
    b"S\r\n"
)
FACTS_NOTIFIES = (
    b"CREATE_NOTIFY 1 S job-1\r\n"
    b"STATUS_NOTIFY job-1 PENDING queued\r\n"
    b"STATUS_NOTIFY job-1 ACTIVE started\r\n"
    b"STATUS_NOTIFY job-1 DONE exit status 0\r\n"
)


def read_all(*chunks: bytes, eof: bool = False) -> list:
    reader = RequestReader()
    events = []
    for chunk in chunks:
        if chunk:  # b"" would mean end of file
            events += reader.receive_data(chunk)
    if eof:
        events += reader.receive_data(b"")
    return events


def requests_only(events: list) -> list:
    return [e for e in events if not isinstance(e, (InputWarning, EndOfInput))]


# --------------------------------------------------------------------------- the facts sheet's exchange


def test_facts_exchange_requests_become_events():
    assert read_all(FACTS_REQUESTS) == FACTS_EVENTS


def test_facts_exchange_replies_and_notifies_byte_for_byte():
    replies = reply_features() + reply_success() + reply_success() + reply_success()
    assert replies == FACTS_REPLIES
    notifies = (
        notify_created("1", "job-1")
        + notify_status("job-1", InvokeStatus.PENDING, "queued")
        + notify_status("job-1", InvokeStatus.ACTIVE, "started")
        + notify_status("job-1", InvokeStatus.DONE, "exit status 0")
    )
    assert notifies == FACTS_NOTIFIES


def test_client_side_encoders_write_the_facts_requests():
    data = (
        encode_request("QUERY_FEATURES")
        + encode_job_create(1, FACTS_ATTRIBUTES)
        + encode_request("JOB_DESTROY", "job-1")
        + encode_request("EXIT")
    )
    assert data == FACTS_REQUESTS


def test_lf_only_input_gives_the_same_events():
    data = FACTS_REQUESTS.replace(b"\r\n", b"\n")
    assert b"\r" not in data
    assert read_all(data) == FACTS_EVENTS


def test_mixed_line_ends_give_the_same_events():
    lines = FACTS_REQUESTS.split(b"\r\n")[:-1]
    data = b"".join(line + (b"\n" if i % 2 else b"\r\n") for i, line in enumerate(lines))
    assert read_all(data) == FACTS_EVENTS


def test_every_split_point_gives_the_same_events():
    for cut in range(len(FACTS_REQUESTS) + 1):
        assert read_all(FACTS_REQUESTS[:cut], FACTS_REQUESTS[cut:]) == FACTS_EVENTS, cut


def test_every_split_point_with_lf_only():
    data = FACTS_REQUESTS.replace(b"\r\n", b"\n")
    for cut in range(len(data) + 1):
        assert read_all(data[:cut], data[cut:]) == FACTS_EVENTS, cut


def test_byte_at_a_time_gives_the_same_events():
    chunks = [FACTS_REQUESTS[i : i + 1] for i in range(len(FACTS_REQUESTS))]
    assert read_all(*chunks) == FACTS_EVENTS


def test_cr_and_lf_split_across_chunks():
    events = read_all(b"JOB_STATUS job-1\r", b"\nEXIT\r", b"\n")
    assert events == [JobStatus("job-1"), Exit()]


# --------------------------------------------------------------------------- JOB_CREATE


def test_job_create_done_is_accepted_as_the_end():
    data = encode_job_create(7, [("hostname", "h")], terminator="JOB_CREATE_DONE")
    assert read_all(data) == [JobCreate("7", (("hostname", "h"),), "JOB_CREATE_DONE")]


def test_terminator_with_trailing_blanks_ends_the_create():
    events = read_all(b"JOB_CREATE 2\r\nport 0\r\nJOB_CREATE_END  \r\nEXIT\r\n")
    assert events == [JobCreate("2", (("port", "0"),)), Exit()]


def test_attribute_values_keep_their_spaces_and_order():
    events = read_all(
        b"JOB_CREATE 3\r\nargument a  b \r\nenvironment X=1 2\r\nargument c\r\nflag\r\nJOB_CREATE_END\r\n"
    )
    assert events == [JobCreate("3", (("argument", "a  b "), ("environment", "X=1 2"), ("argument", "c"), ("flag", "")))]


def test_request_names_inside_a_create_are_attributes():
    events = read_all(b"JOB_CREATE 4\r\nEXIT now\r\nJOB_DESTROY job-1\r\nJOB_CREATE_END\r\n")
    assert events == [JobCreate("4", (("EXIT", "now"), ("JOB_DESTROY", "job-1")))]


def test_empty_line_inside_a_create_is_a_warning_only():
    events = read_all(b"JOB_CREATE 5\r\n\r\nport 0\r\nJOB_CREATE_END\r\n")
    assert isinstance(events[0], InputWarning)
    assert events[1:] == [JobCreate("5", (("port", "0"),))]


def test_bad_request_id_fails_at_the_end_and_its_attributes_are_not_requests():
    events = read_all(b"JOB_CREATE one\r\nEXIT\r\nJOB_CREATE_END\r\nJOB_STATUS job-1\r\n")
    assert len(events) == 2
    assert isinstance(events[0], RequestError)
    assert events[0].request == "JOB_CREATE"
    assert "'one' is not a decimal number" in events[0].reason
    assert events[1] == JobStatus("job-1")


def test_job_create_without_request_id_fails_once():
    events = read_all(b"JOB_CREATE\r\nport 0\r\nJOB_CREATE_END\r\n")
    assert len(events) == 1 and isinstance(events[0], RequestError)
    assert "one request id" in events[0].reason


def test_eof_inside_a_create_is_reported_with_its_request_id():
    events = read_all(b"JOB_CREATE 12\r\nhostname h\r\nport 0\r\n", eof=True)
    assert events == [
        CreateInterrupted("12", "JOB_CREATE 12: input ended before JOB_CREATE_END"),
        EndOfInput(),
    ]


def test_eof_inside_a_create_and_inside_a_line():
    events = read_all(b"JOB_CREATE 12\r\nhostna", eof=True)
    assert isinstance(events[0], InputWarning) and "ended inside a line" in events[0].reason
    assert events[1:] == [CreateInterrupted("12", "JOB_CREATE 12: input ended before JOB_CREATE_END"), EndOfInput()]


def test_create_too_big_in_all_fails_and_reader_recovers():
    line = b"argument " + b"x" * 1000 + b"\r\n"
    count = MAX_CREATE_BYTES // len(line) + 2
    reader = RequestReader()
    events = reader.receive_data(b"JOB_CREATE 6\r\n")
    for _ in range(count):
        events += reader.receive_data(line)
    assert reader.buffered_bytes < len(line)
    events += reader.receive_data(b"JOB_CREATE_END\r\nEXIT\r\n")
    assert len(events) == 2
    assert isinstance(events[0], RequestError) and f"more than {MAX_CREATE_BYTES} bytes" in events[0].reason
    assert events[0].reason.startswith("JOB_CREATE 6: ")
    assert events[1] == Exit()


# --------------------------------------------------------------------------- long lines


def test_long_request_line_is_refused_without_buffering_it():
    reader = RequestReader()
    events = reader.receive_data(b"JOB_STATUS ")
    chunk = b"x" * 65536
    high = 0
    for _ in range(160):  # 10 MiB
        events += reader.receive_data(chunk)
        high = max(high, reader.buffered_bytes)
    assert high <= MAX_LINE_BYTES + 1 + len(chunk)
    assert reader.buffered_bytes <= 64
    events += reader.receive_data(b"\r\nEXIT\r\n")
    assert len(events) == 2
    assert events[0] == RequestError("JOB_STATUS", f"JOB_STATUS: line 1 is longer than {MAX_LINE_BYTES} bytes; refused")
    assert events[1] == Exit()


def test_long_line_arriving_whole_is_refused_too():
    events = read_all(b"JOB_DESTROY " + b"y" * (MAX_LINE_BYTES + 10) + b"\r\nEXIT\r\n")
    assert isinstance(events[0], RequestError) and "longer than" in events[0].reason
    assert events[1] == Exit()


def test_line_at_the_limit_is_accepted_and_one_past_it_is_not():
    at_limit = b"JOB_STATUS " + b"j" * (MAX_LINE_BYTES - len(b"JOB_STATUS "))
    assert len(at_limit) == MAX_LINE_BYTES
    assert read_all(at_limit + b"\r\n") == [JobStatus("j" * (MAX_LINE_BYTES - 11))]
    chunks = [at_limit[:1000], at_limit[1000:], b"\r", b"\n"]
    assert read_all(*chunks) == [JobStatus("j" * (MAX_LINE_BYTES - 11))]
    events = read_all(at_limit + b"j\r\n")
    assert isinstance(events[0], RequestError)


def test_long_line_that_is_not_a_request_is_a_warning():
    events = read_all(b"z" * (MAX_LINE_BYTES * 3) + b"\nEXIT\n")
    assert isinstance(events[0], InputWarning) and "longer than" in events[0].reason
    assert events[1:] == [Exit()]


def test_long_attribute_line_fails_its_create_naming_the_line():
    data = (
        b"JOB_CREATE 8\r\nhostname h\r\nargument "
        + b"a" * (MAX_LINE_BYTES * 2)
        + b"\r\nport 0\r\nJOB_CREATE_END\r\nJOB_STATUS job-2\r\n"
    )
    for chunks in ([data], [data[:100], data[100:70000], data[70000:]]):
        events = read_all(*chunks)
        assert len(events) == 2, events
        assert isinstance(events[0], RequestError)
        assert events[0].reason == f"JOB_CREATE 8: attribute line 3 (b'argument') is longer than {MAX_LINE_BYTES} bytes"
        assert events[1] == JobStatus("job-2")


def test_long_job_create_line_fails_the_create_once():
    data = b"JOB_CREATE " + b"9" * (MAX_LINE_BYTES + 1) + b"\r\nEXIT\r\nJOB_CREATE_END\r\nJOB_STATUS job-3\r\n"
    events = read_all(data)
    assert len(events) == 2
    assert isinstance(events[0], RequestError) and events[0].request == "JOB_CREATE"
    assert events[1] == JobStatus("job-3")


# --------------------------------------------------------------------------- bad input


def test_non_utf8_request_line_is_refused_with_the_reason():
    events = read_all(b"JOB_STATUS job-\xff\r\nEXIT\r\n")
    assert events[0] == RequestError(
        "JOB_STATUS", "JOB_STATUS: line 1 is not valid UTF-8 (byte 0xFF at offset 15 is not UTF-8)"
    )
    assert events[1] == Exit()


def test_non_utf8_attribute_fails_the_create_naming_the_line():
    events = read_all(b"JOB_CREATE 3\r\nhostname h\r\nargument caf\xe9\r\nport 0\r\nJOB_CREATE_END\r\nEXIT\r\n")
    assert len(events) == 2
    assert events[0] == RequestError(
        "JOB_CREATE",
        "JOB_CREATE 3: attribute line 3 (b'argument') is not valid UTF-8 (byte 0xE9 at offset 12 is not UTF-8)",
    )
    assert events[1] == Exit()


def test_non_utf8_stray_line_is_a_warning():
    events = read_all(b"\xff\xfe garbage\r\nEXIT\r\n")
    assert isinstance(events[0], InputWarning)
    assert events[1] == Exit()


def test_utf8_values_pass_through():
    events = read_all("JOB_CREATE 1\r\nargument größe ✓\r\nJOB_CREATE_END\r\n".encode())
    assert events == [JobCreate("1", (("argument", "größe ✓"),))]


def test_unknown_request_is_refused_naming_it():
    events = read_all(b"JOB_SUSPEND job-1\r\n")
    assert len(events) == 1
    assert events[0].request == "JOB_SUSPEND"
    assert events[0].reason.startswith("unknown request JOB_SUSPEND; this server serves JOB_CREATE, JOB_STATUS")


def test_attribute_line_outside_a_create_is_a_warning_not_a_request():
    events = read_all(b"hostname localhost\r\nport 0\r\nJOB_STATUS job-1\r\n")
    assert [type(e) for e in events] == [InputWarning, InputWarning, JobStatus]
    assert "not a request and not inside a JOB_CREATE" in events[0].reason
    assert requests_only(events) == [JobStatus("job-1")]


def test_stray_create_end_and_empty_lines_are_warnings():
    events = read_all(b"JOB_CREATE_END\r\n\r\n   \r\nEXIT\r\n")
    assert [type(e) for e in events] == [InputWarning, InputWarning, InputWarning, Exit]


@pytest.mark.parametrize(
    "line, name, words",
    [
        (b"JOB_DESTROY", "JOB_DESTROY", "one job id, got 0"),
        (b"JOB_STATUS a b", "JOB_STATUS", "one job id, got 2"),
        (b"EXIT now", "EXIT", "no arguments, got 1"),
        (b"QUERY_FEATURES x", "QUERY_FEATURES", "no arguments, got 1"),
    ],
)
def test_wrong_number_of_arguments(line, name, words):
    (event,) = read_all(line + b"\r\n")
    assert isinstance(event, RequestError) and event.request == name and words in event.reason


def test_nothing_is_served_after_exit():
    reader = RequestReader()
    events = reader.receive_data(b"EXIT\r\nJOB_STATUS job-1\r\n")
    assert events[0] == Exit()
    assert [type(e) for e in events[1:]] == [InputWarning]
    assert reader.state is ReaderState.CLOSED
    assert reader.receive_data(b"") == [EndOfInput()]
    assert reader.receive_data(b"more") == []


def test_end_of_input_between_requests():
    assert read_all(b"JOB_STATUS job-1\r\n", eof=True) == [JobStatus("job-1"), EndOfInput()]


# --------------------------------------------------------------------------- encoders


def test_replies():
    assert reply_success() == b"S\r\n"
    assert reply_success(InvokeStatus.ACTIVE) == b"S ACTIVE\r\n"
    assert reply_failure("no job job-9") == b"F no job job-9\r\n"
    assert reply_failure("two\r\nlines\n") == b"F two lines\r\n"
    assert reply_failure("") == b"F failed\r\n"


def test_features_reply_with_features():
    data = reply_features(features=["STAGING_AUTH_NUMBER"], requests=["JOB_CREATE", "EXIT"])
    assert data == b"SM\r\nprotocol_version 2.0\r\nfeature STAGING_AUTH_NUMBER\r\nrequest JOB_CREATE\r\nrequest EXIT\r\nREPLY_END\r\n"


def test_notifies():
    assert notify_created("3", "job-3") == b"CREATE_NOTIFY 3 S job-3\r\n"
    assert notify_create_failed("3", "program /x: No such file") == b"CREATE_NOTIFY 3 F program /x: No such file\r\n"
    assert notify_status("job-3", InvokeStatus.FAILED) == b"STATUS_NOTIFY job-3 FAILED\r\n"
    assert notify_status("job-3", InvokeStatus.FAILED, "  ") == b"STATUS_NOTIFY job-3 FAILED\r\n"
    assert notify_status("job-3", InvokeStatus.DONE, "a\rb") == b"STATUS_NOTIFY job-3 DONE a b\r\n"


@pytest.mark.parametrize("job_id", ["", "job 1", "job\t1", "x" * 1025, "job-\u00e9"])
def test_job_ids_the_client_cannot_take_are_refused(job_id):
    with pytest.raises(ValueError):
        notify_created("1", job_id)
    with pytest.raises(ValueError):
        check_job_id(job_id)


def test_longest_job_id_is_accepted():
    assert notify_status("j" * 1024, InvokeStatus.DONE).startswith(b"STATUS_NOTIFY " + b"j" * 1024 + b" DONE")


def test_request_id_must_be_decimal_in_notifies():
    with pytest.raises(ValueError):
        notify_created("1a", "job-1")


def test_long_text_is_capped():
    data = reply_failure("e" * 100000)
    assert len(data) < 4100 and data.endswith(b"...\r\n")


def test_parse_notify():
    assert parse_notify("CREATE_NOTIFY 2 S job-2") == CreateNotify("2", True, job_id="job-2")
    assert parse_notify("CREATE_NOTIFY 2 F no such program") == CreateNotify("2", False, reason="no such program")
    assert parse_notify("STATUS_NOTIFY job-2 DONE exit status 0") == StatusNotify("job-2", InvokeStatus.DONE, "exit status 0")
    assert parse_notify("STATUS_NOTIFY job-2 ACTIVE") == StatusNotify("job-2", InvokeStatus.ACTIVE, None)
    assert parse_notify("SOMETHING_NEW 1 2") is None
    with pytest.raises(ValueError):
        parse_notify("STATUS_NOTIFY job-2 RUNNING")
    with pytest.raises(ValueError):
        parse_notify("CREATE_NOTIFY 2 X job-2")


# --------------------------------------------------------------------------- properties

_value_text = st.text(
    st.characters(blacklist_categories=("Cs",), blacklist_characters="\r\n\x85\u2028\u2029"), max_size=40
).filter(lambda t: not any(ord(c) < 32 or ord(c) == 127 for c in t))
_name_text = st.from_regex(r"[a-z][a-z_]{0,15}", fullmatch=True).filter(lambda n: n.upper() != n)
_job_id = st.from_regex(r"[!-~]{1,30}", fullmatch=True)
_request = st.one_of(
    st.builds(QueryFeatures),
    st.builds(Exit),
    st.builds(JobStatus, _job_id),
    st.builds(JobDestroy, _job_id),
    st.builds(
        JobCreate,
        st.integers(1, 10**9).map(str),
        st.lists(st.tuples(_name_text, _value_text), max_size=8).map(tuple),
        st.sampled_from(["JOB_CREATE_END", "JOB_CREATE_DONE"]),
    ),
)


def _encode(event) -> bytes:
    if isinstance(event, JobCreate):
        return encode_job_create(event.request_id, event.attributes, event.terminator)
    if isinstance(event, QueryFeatures):
        return encode_request("QUERY_FEATURES")
    if isinstance(event, Exit):
        return encode_request("EXIT")
    if isinstance(event, JobStatus):
        return encode_request("JOB_STATUS", event.job_id)
    return encode_request("JOB_DESTROY", event.job_id)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(_request, max_size=6),
    st.booleans(),
    st.lists(st.integers(0, 10**6), max_size=8),
)
def test_any_request_stream_in_any_chunks_reads_back(requests, lf_only, cuts):
    # Nothing after EXIT is served: keep the stream up to the first EXIT.
    for index, event in enumerate(requests):
        if isinstance(event, Exit):
            requests = requests[: index + 1]
            break
    data = b"".join(_encode(e) for e in requests)
    if lf_only:
        data = data.replace(b"\r\n", b"\n")
    points = sorted({c % (len(data) + 1) for c in cuts})
    chunks = [data[a:b] for a, b in zip([0] + points, points + [len(data)])]
    assert requests_only(read_all(*chunks)) == requests


@settings(max_examples=200, deadline=None)
@given(st.lists(st.binary(max_size=300), max_size=10))
def test_arbitrary_bytes_never_break_the_reader(chunks):
    reader = RequestReader(max_line_bytes=256, max_create_bytes=1024)
    events = []
    for chunk in chunks:
        if chunk:
            events += reader.receive_data(chunk)
        assert reader.buffered_bytes <= 256 + 1 + 300
    events += reader.receive_data(b"")
    assert events[-1] == EndOfInput()
    kinds = (QueryFeatures, JobCreate, JobStatus, JobDestroy, Exit, RequestError, InputWarning, CreateInterrupted)
    assert all(isinstance(e, kinds) for e in events[:-1])


@settings(max_examples=200, deadline=None)
@given(_job_id, st.sampled_from(list(InvokeStatus)), st.one_of(st.none(), st.text(max_size=60)))
def test_status_notify_round_trip(job_id, status, text):
    data = notify_status(job_id, status, text)
    assert data.endswith(b"\r\n") and data.count(b"\n") == 1 and data.count(b"\r") == 1
    parsed = parse_notify(data[:-2].decode())
    expected_text = None if text is None else (one_line(text, default="") or None)
    assert parsed == StatusNotify(job_id, status, expected_text)


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 10**12).map(str), st.text(max_size=80))
def test_create_failed_notify_round_trip(request_id, reason):
    data = notify_create_failed(request_id, reason)
    assert data.count(b"\n") == 1 and data.endswith(b"\r\n")
    assert parse_notify(data[:-2].decode()) == CreateNotify(request_id, False, reason=one_line(reason))


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=200))
def test_failure_reply_is_always_one_line(reason):
    data = reply_failure(reason)
    assert data.startswith(b"F ") and data.endswith(b"\r\n")
    assert data.count(b"\n") == 1 and data.count(b"\r") == 1
