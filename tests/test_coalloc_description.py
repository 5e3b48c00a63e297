"""The multi-part job description: JSON and the multi-request form, parsed to one value."""

from __future__ import annotations

import json
import random
import string
from typing import List

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy_agent.service.coalloc.description import (
    MAX_COUNT,
    MAX_PARTS,
    BarrierRelease,
    CommsType,
    DescriptionError,
    MultiJobDescription,
    Part,
    StartType,
    parse_description,
    parse_json,
    parse_part_json,
    parse_part_rsl,
    parse_rsl,
    render_json,
    render_part_rsl,
    render_rsl,
)
from proxy_agent.service.jobs import JobSpec

# --------------------------------------------------------------------------- strategies

texts = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=12)
nonempty_texts = texts.filter(bool)
labels = st.text(
    st.characters(blacklist_categories=("Cs", "Cc"), blacklist_characters="\x00\x7f"), min_size=1, max_size=10
)
words = st.text(string.ascii_letters + string.digits + "._-", min_size=1, max_size=8)
queues = st.one_of(st.none(), words, st.builds(lambda a, b: f"{a}:{b}", words, words))
env_names = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,6}", fullmatch=True).filter(
    lambda name: not name.upper().startswith(("PROXY_AGENT_", "GLOBUS_GRAM_"))
)
environments = st.lists(st.tuples(env_names, texts), max_size=3, unique_by=lambda pair: pair[0])


@st.composite
def parts(draw, label=None) -> Part:
    return Part(
        executable=draw(nonempty_texts),
        queue=draw(queues),
        count=draw(st.integers(1, MAX_COUNT)),
        arguments=draw(st.lists(texts, max_size=4)),
        environment=draw(environments),
        label=label,
        start_type=draw(st.sampled_from(StartType)),
        comms_type=draw(st.sampled_from(CommsType)),
        directory=draw(st.one_of(st.none(), nonempty_texts)),
        stdout=draw(st.one_of(st.none(), nonempty_texts)),
        stderr=draw(st.one_of(st.none(), nonempty_texts)),
        project=draw(st.one_of(st.none(), nonempty_texts)),
        max_wall_time=draw(st.one_of(st.none(), st.integers(1, 10**6))),
        max_memory=draw(st.one_of(st.none(), st.integers(1, 10**6))),
    )


@st.composite
def descriptions(draw) -> MultiJobDescription:
    count = draw(st.integers(1, 4))
    part_labels = draw(st.lists(st.one_of(st.none(), labels), min_size=count, max_size=count))
    seen = set()
    unique = []
    for label in part_labels:
        unique.append(None if label in seen else label)
        seen.add(label)
    return MultiJobDescription(
        parts=[draw(parts(label=label)) for label in unique],
        name=draw(st.one_of(st.none(), nonempty_texts)),
        barrier_release=draw(st.sampled_from(BarrierRelease)),
        forward_rendezvous=draw(st.booleans()),
    )


# --------------------------------------------------------------------------- a writer that varies everything

_PLAIN = set(string.ascii_letters + string.digits + "._-/:,@%*~")
_SPACES = [" ", "\n", "\t ", " (* a comment *) ", "\n(**)\n"]


class Writer:
    """Writes a description in the multi-request form, choosing at random among the ways
    the syntax allows: quoting styles, concatenation, attribute spelling, spacing, order."""

    def __init__(self, rnd) -> None:
        self.rnd = rnd

    def space(self, required: bool = False) -> str:
        if not required and self.rnd.random() < 0.5:
            return ""
        return self.rnd.choice(_SPACES)

    def name(self, canonical: str) -> str:
        out = []
        for char in canonical:
            if self.rnd.random() < 0.15:
                out.append("_")
            out.append(char.upper() if self.coin() else char.lower())
        return "".join(out)

    def simple(self, text: str) -> str:
        styles = ["double", "single", "caret"]
        if text and set(text) <= _PLAIN and not text.startswith("*"):
            styles.append("plain")
        style = self.rnd.choice(styles)
        if style == "plain":
            return text
        if style == "double":
            return '"' + text.replace('"', '""') + '"'
        if style == "single":
            return "'" + text.replace("'", "''") + "'"
        delimiter = next(char for char in "|/!%@~;,?" if char not in text)
        return "^" + delimiter + text + delimiter

    def value(self, text: str) -> str:
        if len(text) >= 2 and self.rnd.random() < 0.25:
            cut = self.rnd.randint(1, len(text) - 1)
            return self.simple(text[:cut]) + self.space() + "#" + self.space() + self.simple(text[cut:])
        return self.simple(text)

    def relation(self, canonical: str, values: List[str]) -> str:
        body = self.space(True).join(values)
        return "(" + self.space() + self.name(canonical) + self.space() + "=" + self.space() + body + self.space() + ")"

    def part(self, part: Part) -> str:
        relations = []
        if part.queue is not None:
            if ":" in part.queue and self.coin():
                scheduler, queue = part.queue.split(":")
                relations.append(self.relation("resourcemanagercontact", [self.value(scheduler)]))
                relations.append(self.relation("queue", [self.value(queue)]))
            elif self.coin():
                relations.append(self.relation("queue", [self.value(part.queue)]))
            else:
                relations.append(self.relation("resourcemanagercontact", [self.value(part.queue)]))
        if part.count != 1 or self.coin():
            relations.append(self.relation("count", [self.value(str(part.count))]))
        relations.append(self.relation("executable", [self.value(part.executable)]))
        if part.arguments or self.coin():
            relations.append(self.relation("arguments", [self.value(arg) for arg in part.arguments]))
        if part.environment:
            pairs = [
                "(" + self.space() + self.value(name) + self.space(True) + self.value(value) + self.space() + ")"
                for name, value in part.environment
            ]
            relations.append(self.relation("environment", pairs))
        if part.label is not None:
            relations.append(self.relation("label", [self.value(part.label)]))
        if part.start_type is not StartType.STRICT_BARRIER or self.coin():
            relations.append(self.relation("subjobstarttype", [self.value(self.cased(part.start_type.value))]))
        if part.comms_type is not CommsType.BLOCKING_JOIN or self.coin():
            relations.append(self.relation("subjobcommstype", [self.value(self.cased(part.comms_type.value))]))
        for field in ("directory", "stdout", "stderr", "project"):
            if getattr(part, field) is not None:
                relations.append(self.relation(field, [self.value(getattr(part, field))]))
        if part.max_wall_time is not None:
            relations.append(self.relation("maxwalltime", [self.value(str(part.max_wall_time))]))
        if part.max_memory is not None:
            relations.append(self.relation("maxmemory", [self.value(str(part.max_memory))]))
        self.rnd.shuffle(relations)
        return "&" + self.space() + self.space().join(relations)

    def coin(self) -> bool:
        return self.rnd.random() < 0.5

    def cased(self, text: str) -> str:
        return text.upper() if self.coin() else text

    def description(self, description: MultiJobDescription) -> str:
        body = "+" + self.space() + self.space().join(
            "(" + self.space() + self.part(part) + self.space() + ")" for part in description.parts
        )
        options = []
        if description.name is not None:
            options.append(self.relation("name", [self.value(description.name)]))
        if description.barrier_release is not BarrierRelease.AUTO or self.coin():
            options.append(self.relation("barrierrelease", [self.value(description.barrier_release.value)]))
        if description.forward_rendezvous or self.coin():
            word = ("yes" if description.forward_rendezvous else "no") if self.coin() else (
                "true" if description.forward_rendezvous else "false"
            )
            options.append(self.relation("forwardrendezvous", [self.value(word)]))
        text = body
        if options:
            options.append("(" + self.space() + body + self.space() + ")")
            self.rnd.shuffle(options)
            text = "&" + self.space() + self.space().join(options)
        return self.space() + text + self.space()


# --------------------------------------------------------------------------- properties


@settings(max_examples=75, deadline=None)
@given(descriptions())
def test_json_and_multi_request_forms_parse_to_the_same_description(description):
    from_json = parse_json(render_json(description))
    from_rsl = parse_rsl(render_rsl(description))
    assert from_json == description
    assert from_rsl == description
    assert parse_description(render_json(description, indent=None)) == parse_description(render_rsl(description))


@settings(max_examples=75, deadline=None)
@given(descriptions(), st.integers(0, 2**32 - 1))
def test_any_way_of_writing_the_multi_request_form_parses_back(description, seed):
    text = Writer(random.Random(seed)).description(description)
    assert parse_rsl(text) == description, text


@settings(max_examples=60, deadline=None)
@given(parts(label=None), st.integers(0, 2**32 - 1))
def test_single_part_forms_round_trip(part, seed):
    assert parse_part_rsl(render_part_rsl(part)) == part
    assert parse_part_rsl(Writer(random.Random(seed)).part(part)) == part
    assert parse_part_json(json.dumps(json.loads(render_json(MultiJobDescription(parts=[part])))["parts"][0])) == part


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet='+&|()=<>!"\'^#$ \n*ab1', max_size=40))
def test_garbage_gives_a_description_error_and_nothing_else(text):
    try:
        parse_rsl(text)
    except DescriptionError:
        pass


# --------------------------------------------------------------------------- the forms by example

BRIEF_EXAMPLE = """
+( &(resourceManagerContact="slurm:debug")(count=2)(executable="/bin/app")(arguments="-x" "1")
    (environment=(A "1"))(label="sub1")(subjobStartType=strict-barrier)(subjobCommsType=blocking-join) )
 ( &(resourceManagerContact="local")(executable=/bin/true)(subjobStartType=no-barrier)
    (subjobCommsType=independent) )
"""


def test_the_documented_multi_request_example():
    description = parse_rsl(BRIEF_EXAMPLE)
    first, second = description.parts
    assert first == Part(
        executable="/bin/app",
        queue="slurm:debug",
        count=2,
        arguments=("-x", "1"),
        environment=(("A", "1"),),
        label="sub1",
        start_type=StartType.STRICT_BARRIER,
        comms_type=CommsType.BLOCKING_JOIN,
    )
    assert second.queue == "local" and second.count == 1 and second.label is None
    assert second.start_type is StartType.NO_BARRIER and second.comms_type is CommsType.INDEPENDENT
    assert description.barrier_release is BarrierRelease.AUTO


def test_the_same_job_in_json():
    text = json.dumps(
        {
            "parts": [
                {
                    "queue": "slurm:debug",
                    "count": 2,
                    "executable": "/bin/app",
                    "arguments": ["-x", "1"],
                    "environment": {"A": "1"},
                    "label": "sub1",
                    "start_type": "strict-barrier",
                    "comms_type": "blocking-join",
                },
                {
                    "queue": "local",
                    "executable": "/bin/true",
                    "start_type": "no-barrier",
                    "comms_type": "independent",
                },
            ]
        }
    )
    assert parse_json(text) == parse_rsl(BRIEF_EXAMPLE)
    # a bare list of parts is a job with default options
    assert parse_json(json.dumps(json.loads(text)["parts"])) == parse_rsl(BRIEF_EXAMPLE)


def test_lexical_rules():
    description = parse_rsl(
        '''(* the whole job *)
        &(Barrier_Release = EXPLICIT)(name='it''s')(FORWARDRENDEZVOUS=yes)
         (rslSubstitution=(ROOT "/opt/app"))
         ( +( &(executable=$(ROOT) # /bin/run)
               (rsl_substitution=(MODE ^|a "quoted" b|))
               (arguments= "say ""hi""" 'single''s' $(MODE) plain-word)
               (environment=(PATH $(ROOT)#"/bin")(EMPTY ""))
               (queue=debug)(resource_manager_contact=slurm) ) )'''
    )
    assert description.name == "it's"
    assert description.barrier_release is BarrierRelease.EXPLICIT
    assert description.forward_rendezvous is True
    (part,) = description.parts
    assert part.executable == "/opt/app/bin/run"
    assert part.arguments == ('say "hi"', "single's", 'a "quoted" b', "plain-word")
    assert part.environment == (("PATH", "/opt/app/bin"), ("EMPTY", ""))
    assert part.queue == "slurm:debug"


def test_part_converts_to_a_job_spec():
    part = Part(
        executable="/bin/app",
        queue="slurm:debug",
        count=3,
        arguments=["a"],
        environment={"A": "1"},
        label="sub1",
        directory="/tmp",
        stdout="out",
        stderr="err",
        project="proj",
        max_wall_time=5,
        max_memory=100,
    )
    spec = part.to_job_spec(environment=[("PROXY_AGENT_PART", "0")])
    assert spec == JobSpec(
        executable="/bin/app",
        arguments=("a",),
        environment=(("A", "1"), ("PROXY_AGENT_PART", "0")),
        working_dir="/tmp",
        num_procs=3,
        queue="slurm:debug",
        name="sub1",
        stdout_path="out",
        stderr_path="err",
        account="proj",
        wall_time=300,
        memory=100,
    )
    named = MultiJobDescription(parts=[part, Part("/bin/b")], name="demo").to_job_specs()
    assert [spec.name for spec in named] == ["demo.sub1", "demo.1"]


# --------------------------------------------------------------------------- errors name the place


def error_of(text: str) -> DescriptionError:
    with pytest.raises(DescriptionError) as caught:
        parse_description(text)
    return caught.value


def test_a_bad_value_names_part_label_field_and_position():
    error = error_of('+( &(executable=a) )\n( &(label="sub1")(executable=b)\n   (count=lots) )')
    assert (error.part_index, error.part_label, error.field) == (1, "sub1", "count")
    assert (error.line, error.column) == (3, 5)
    assert str(error) == "line 3, column 5: part 1 ('sub1'): count: must be a whole number, not 'lots'"


def test_json_errors_name_part_label_and_field():
    error = error_of('{"parts": [{"executable": "a"}, {"executable": "b", "label": "two", "start_type": "strict"}]}')
    assert (error.part_index, error.part_label, error.field) == (1, "two", "start_type")
    assert "strict-barrier, loose-barrier, no-barrier" in str(error)
    error = error_of('[{"executable": "a", "environment": {"A": 1}}]')
    assert error.part_index == 0 and error.field == "environment A" and "text" in error.reason
    error = error_of('[{"executable": "a", "cuont": 2}]')
    assert error.field == "cuont" and "unknown key" in error.reason
    error = error_of('[{"executable": "a", "count": 2, "count": 3}]')
    assert "twice" in str(error)
    error = error_of('[{"count": 2}]')
    assert (error.part_index, error.field, error.reason) == (0, "executable", "is missing")
    error = error_of('{"parts": [{"executable": "a"}], "barrier_release": "later"}')
    assert error.field == "barrier_release"
    error = error_of('{"parts": [{"executable": "a",}]}')
    assert error.line == 1 and "not valid JSON" in error.reason


@pytest.mark.parametrize(
    "text, line, column, words",
    [
        ('+( &(executable="a) )', 1, 17, "never closed"),
        ("+( &(executable=a)\n", 2, 1, "expected ')'"),
        ("+( &(executable=a) ) junk", 1, 22, "after the request"),
        ("+( &(executable=a)(* no end )", 1, 19, "comment"),
        ("+( &(executable a) )", 1, 17, "operator"),
        ("+( &(executable=a ! b) )", 1, 19, "'!='"),
        ("+( &(=a) )", 1, 6, "attribute name"),
        ("+( &(executable=$(X)) )", 1, 17, "$(X) is not defined"),
        ("+( &(executable=a # ) )", 1, 21, "after '#'"),
        ("executable=a", 1, 1, "multi-request"),
        ("+( |(executable=a) )", 1, 4, "not supported"),
        ("+( &(executable=a)(count<=2) )", 1, 20, "takes '='"),
        ("+( &(executable=a)(count=1)(Count=2) )", 1, 29, "given twice (first at line 1, column 20)"),
        ("+( &(executable=a)(flavour=x) )", 1, 20, "unknown attribute"),
        ("+( &(executable=a)(name=x) )", 1, 20, "job option"),
        ("+( &(executable=a b) )", 1, 6, "exactly one value"),
        ("+( &(executable=a)(arguments=(x y)) )", 1, 20, "plain values"),
        ("+( &(executable=a)(environment=(A)) )", 1, 32, "pair (NAME VALUE)"),
        ("+( &(executable=a)(environment=(A 1)(A 2)) )", 1, 20, "given twice"),
        ("+( &(executable=a)(environment=(GLOBUS_GRAM_JOB_HANDLE x)) )", 1, 20, "set by the agent"),
        ("+( &(executable=a)(queue=a:b)(resourceManagerContact=s) )", 1, 20, "neither may contain ':'"),
        ("+( &(executable=a)(queue='a b') )", 1, 20, "SCHEDULER:QUEUE"),
        ("+( &(count=2) )", 1, 4, "executable: is missing"),
        ("+( &(executable=a)(count=0) )", 1, 20, f"from 1 to {MAX_COUNT}"),
        ("+( &(executable=a)(label=x) )( &(executable=b)(label=x) )", 1, 32, "already the label of part 0"),
        ("&(name=a)(barrierRelease=soon)(+(&(executable=a)))", 1, 11, "auto, explicit"),
        ("&(name=a)(executable=a)(+(&(executable=a)))", 1, 11, "belongs inside a part"),
        ("&(name=a)", 1, 1, "exactly one"),
        ("+( &(executable=a)(+(&(executable=b))) )", 1, 20, "nested request"),
    ],
)
def test_syntax_and_meaning_errors_say_where(text, line, column, words):
    error = error_of(text)
    assert (error.line, error.column) == (line, column), str(error)
    assert words in str(error)


def test_limits():
    many = "+" + "".join("(&(executable=a))" for _ in range(MAX_PARTS + 1))
    assert "at most" in str(error_of(many))
    deep = "+(&(executable=a)(arguments=" + "(" * 100 + ")" * 100 + "))"
    assert "nest" in str(error_of(deep))
    assert "longer than" in str(error_of("+(&(executable=" + "a" * (1024 * 1024) + "))"))
    assert "nests too deeply" in str(error_of("[" * 100_000 + "]" * 100_000))
    error = error_of(json.dumps([{"executable": "a"}] * (MAX_PARTS + 1)))
    assert "at most" in str(error)


def test_invalid_utf8_is_refused_clearly():
    assert "UTF-8" in str(error_of(b"+(&(executable=\xff))"))  # type: ignore[arg-type]
    with pytest.raises(DescriptionError, match="UTF-8"):
        parse_json(b'[{"executable": "\xff"}]')


def test_constructing_directly_checks_too():
    with pytest.raises(DescriptionError, match="count: must be from 1"):
        Part("a", count=0)
    with pytest.raises(DescriptionError, match="part 1 \\('x'\\): label"):
        MultiJobDescription(parts=[Part("a", label="x"), Part("b", label="x")])
    with pytest.raises(DescriptionError, match="at least one part"):
        MultiJobDescription(parts=[])
    with pytest.raises(DescriptionError, match="lone surrogate"):
        Part("\udc80")
