"""The coordination state machine of a multi-part job, driven directly."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy_agent.service.coalloc.description import MultiJobDescription, Part
from proxy_agent.service.coalloc.rendezvous import decode, encode
from proxy_agent.service.coalloc.state import (
    CannotComplete,
    JobEnded,
    Limits,
    MultiJob,
    NotAllowed,
    Refused,
)
from proxy_agent.service.jobs import JobState


def job(*parts: Part, **options) -> MultiJob:
    return MultiJob("mj1", MultiJobDescription(parts=list(parts), **options))


def strict(count: int = 2, label=None, **more) -> Part:
    return Part("/bin/app", count=count, label=label, start_type="strict-barrier", **more)


def loose(count: int = 2, label=None, **more) -> Part:
    return Part("/bin/app", count=count, label=label, start_type="loose-barrier", **more)


def free(count: int = 1, label=None, **more) -> Part:
    return Part("/bin/app", count=count, label=label, start_type="no-barrier", **more)


def check_in_all(multi: MultiJob, *part_ids: int) -> None:
    for part_id in part_ids:
        for rank in range(multi.part_spec(part_id).count):
            multi.check_in(part_id, rank)


# --------------------------------------------------------------------------- the barrier


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(1, 3), min_size=1, max_size=4), st.data())
def test_the_barrier_opens_exactly_when_the_last_process_checks_in(sizes, data):
    multi = job(*(strict(size) for size in sizes))
    processes = [(part, rank) for part, size in enumerate(sizes) for rank in range(size)]
    order = data.draw(st.permutations(processes))
    for count, (part, rank) in enumerate(order):
        assert not multi.released
        assert multi.state is JobState.PREPARING
        multi.check_in(part, rank)
        if count < len(order) - 1:
            assert multi.barrier_passed(part, rank) is None
    assert multi.released and multi.state is JobState.RUNNING
    assert multi.barrier_waiting_for() == []
    for part, rank in processes:
        passed = multi.barrier_passed(part, rank)
        assert passed is not None and passed.part_index == part and passed.parts == len(sizes) and passed.final


def test_no_barrier_parts_pass_at_once_and_do_not_hold_the_barrier():
    multi = job(strict(1), free(2), loose(1))
    assert multi.barrier_passed(1, 0).final is False  # passes, but the job's layout may still change
    multi.check_in(0, 0)
    assert multi.barrier_waiting_for() == [(2, 0)]
    multi.check_in(2, 0)
    assert multi.released


def test_checking_in_twice_is_harmless_and_polling_without_checking_in_is_an_error():
    multi = job(strict(2))
    multi.check_in(0, 0)
    multi.check_in(0, 0)
    assert not multi.released
    with pytest.raises(NotAllowed, match="has not checked in"):
        multi.barrier_passed(0, 1)
    with pytest.raises(Refused, match="rank 2 is outside part 0"):
        multi.check_in(0, 2)
    with pytest.raises(Refused, match="no part #7"):
        multi.check_in(7, 0)


def test_explicit_release_waits_for_the_owner():
    multi = job(strict(1), strict(1), barrier_release="explicit")
    check_in_all(multi, 0, 1)
    assert not multi.released
    assert multi.release_barrier() is True
    assert multi.barrier_passed(0, 0) is not None


def test_explicit_release_waiting_for_all_parts():
    multi = job(strict(1), strict(1), barrier_release="explicit")
    multi.check_in(0, 0)
    assert multi.release_barrier(wait_for_parts=True) is False
    assert not multi.released
    multi.check_in(1, 0)
    assert multi.released


def test_release_at_once_lets_late_processes_through_as_they_arrive():
    multi = job(strict(2), barrier_release="explicit")
    multi.check_in(0, 0)
    multi.release_barrier()
    assert multi.barrier_passed(0, 0) is not None
    multi.check_in(0, 1)
    assert multi.barrier_passed(0, 1) is not None


def test_a_job_without_barrier_parts_is_released_at_once():
    multi = job(free(1), free(2))
    assert multi.released
    with pytest.raises(NotAllowed, match="released"):
        multi.add_part(free())


# --------------------------------------------------------------------------- adding and deleting parts


def test_parts_added_and_deleted_before_the_release_and_refused_after():
    multi = job(strict(1, "a"), strict(1, "b"), strict(1, "c"))
    check_in_all(multi, 0, 2)
    added = multi.add_part(strict(2, "d"))
    assert added == 3 and multi.part_ids == (0, 1, 2, 3)
    with pytest.raises(NotAllowed, match="label"):
        multi.add_part(strict(1, "d"))
    multi.delete_part(multi.part_by_label("b"))
    assert multi.part_ids == (0, 2, 3)
    assert multi.index_of(2) == 1  # the index shifted; the id did not
    with pytest.raises(NotAllowed, match="part #1 was deleted"):
        multi.check_in(1, 0)
    assert not multi.released
    check_in_all(multi, 3)
    assert multi.released
    passed = multi.barrier_passed(3, 1)
    assert (passed.part_index, passed.parts) == (2, 3)
    with pytest.raises(NotAllowed, match="cannot add a part: the start barrier has been released"):
        multi.add_part(strict(1, "e"))
    with pytest.raises(NotAllowed, match="cannot delete a part: the start barrier has been released"):
        multi.delete_part(0)


def test_deleting_the_part_everyone_waits_for_releases_the_barrier():
    multi = job(strict(1), strict(1))
    multi.check_in(0, 0)
    multi.delete_part(1)
    assert multi.released


def test_the_only_part_cannot_be_deleted():
    multi = job(strict(1))
    with pytest.raises(NotAllowed, match="only part"):
        multi.delete_part(0)


# --------------------------------------------------------------------------- early ends


def test_a_strict_part_ending_before_the_barrier_fails_the_job():
    multi = job(strict(2, "a"), strict(2, "b"), free(1, "c"))
    multi.check_in(0, 0)
    multi.check_in(0, 1)
    verdict = multi.process_ended(1, 0, failed=True)
    assert verdict.failed and verdict.cancel_parts == (0, 1, 2)
    assert "process 0 of part 1 ('b') failed before the start barrier was released" == verdict.reason
    assert multi.state is JobState.FAILED and multi.reason == verdict.reason
    for call in (lambda: multi.barrier_passed(0, 0), lambda: multi.check_in(1, 1), lambda: multi.view(2, 0)):
        with pytest.raises(JobEnded, match="the multi-part job failed: process 0 of part 1"):
            call()
    # later reports change nothing
    assert multi.part_ended(0, JobState.KILLED) == multi.part_ended(0, JobState.KILLED)
    assert multi.state is JobState.FAILED


def test_a_whole_strict_part_ending_before_the_barrier_fails_the_job():
    multi = job(strict(1), strict(1))
    verdict = multi.part_ended(1, JobState.FAILED, "exit code 3")
    assert verdict.failed and verdict.cancel_parts == (0,)
    assert "part 1 ended (FAILED) before the start barrier was released (exit code 3)" == verdict.reason


def test_strict_parts_may_end_after_the_release():
    multi = job(strict(1), strict(1))
    check_in_all(multi, 0, 1)
    assert not multi.process_ended(0, 0).failed
    assert not multi.part_ended(0, JobState.FINISHED).failed
    assert multi.state is JobState.RUNNING
    multi.part_ended(1, JobState.FINISHED)
    assert multi.state is JobState.FINISHED


def test_a_loose_part_ending_early_neither_fails_nor_holds_the_barrier():
    multi = job(strict(1), loose(2))
    multi.check_in(1, 0)
    assert not multi.process_ended(1, 1).failed
    assert not multi.released
    multi.check_in(0, 0)
    assert multi.released and multi.state is JobState.RUNNING


def test_no_barrier_parts_are_independent():
    multi = job(strict(1), free(1))
    assert not multi.part_ended(1, JobState.FAILED, "crashed").failed
    assert multi.state is JobState.PREPARING
    multi.check_in(0, 0)
    multi.part_ended(0, JobState.FINISHED)
    assert multi.state is JobState.FAILED and "crashed" in multi.reason


def test_cancelling_kills_the_job_and_names_every_part_still_running():
    multi = job(strict(1), strict(1), strict(1))
    check_in_all(multi, 0, 1, 2)
    multi.part_ended(2, JobState.FINISHED)
    verdict = multi.cancel("stopped by the owner")
    assert verdict.cancelled and not verdict.failed and verdict.cancel_parts == (0, 1)
    assert multi.state is JobState.KILLED
    with pytest.raises(JobEnded, match="cancelled: stopped by the owner"):
        multi.take_message(0, 0, "t")


def test_a_failed_submission_fails_the_job():
    multi = job(strict(1), strict(1))
    verdict = multi.fail("part 1 could not be submitted: no such queue")
    assert verdict.failed and verdict.cancel_parts == (0, 1)
    assert multi.state is JobState.FAILED


# --------------------------------------------------------------------------- messages


def test_messages_within_a_part_wait_in_order_until_their_tag_is_asked_for():
    multi = job(strict(3))
    multi.send(0, 1, 0, "b", b"b-from-1")
    multi.send(0, 2, 0, "a", b"a-from-2")
    multi.send(0, 1, 0, "a", b"a-from-1")
    multi.send(0, 2, 0, "b", b"b-from-2")
    assert multi.take_message(0, 0, "c") is None
    first = multi.take_message(0, 0, "a")
    assert (first.source, first.data) == (2, b"a-from-2")
    assert multi.take_message(0, 0, "b").data == b"b-from-1"
    assert multi.take_message(0, 0, "b").data == b"b-from-2"
    assert multi.take_message(0, 0, "a").data == b"a-from-1"
    assert multi.take_message(0, 0, "a") is None
    assert multi.take_message(0, 1, "a") is None  # nothing was sent to rank 1
    with pytest.raises(Refused, match="destination rank 3 is outside part 0"):
        multi.send(0, 0, 3, "a", b"")


def test_message_limits():
    multi = MultiJob("mj", MultiJobDescription(parts=[strict(2)]), limits=Limits(queued_bytes=10, message_bytes=8))
    multi.send(0, 0, 1, "t", b"12345678")
    with pytest.raises(Exception, match="at most 8 bytes"):
        multi.send(0, 0, 1, "t", b"123456789")
    with pytest.raises(Exception, match="already holds 8 bytes"):
        multi.send(0, 0, 1, "t", b"123")
    multi.take_message(0, 1, "t")
    multi.send(0, 0, 1, "t", b"123")


def released_group(*parts: Part) -> MultiJob:
    multi = job(*parts)
    for part_id in multi.part_ids:
        if multi.part_spec(part_id).start_type.waits:
            check_in_all(multi, part_id)
    assert multi.released
    return multi


def test_structure_waits_for_every_group_part_to_join():
    multi = released_group(strict(2, "a"), strict(1, "b"), strict(3, "c", comms_type="independent"))
    multi.join(0, 0)
    assert multi.structure(0) is None
    with pytest.raises(NotAllowed, match="rank-0 process"):
        multi.join(0, 1)
    with pytest.raises(NotAllowed, match="independent"):
        multi.join(2, 0)
    multi.join(1, 0)
    structure = multi.structure(0)
    assert structure.part_index == 0
    assert [(p.index, p.label, p.size, p.in_group) for p in structure.parts] == [
        (0, "a", 2, True),
        (1, "b", 1, True),
        (2, "c", 3, False),
    ]


def test_messages_between_parts_go_by_part_index_and_wait_by_tag():
    multi = released_group(strict(1), strict(2), strict(1))
    for part_id in (0, 1, 2):
        multi.join(part_id, 0)
    multi.part_send(0, 0, 2, "x", b"x-from-0")
    multi.part_send(1, 0, 2, "y", b"y-from-1")
    multi.part_send(1, 0, 2, "x", b"x-from-1")
    assert multi.take_part_message(2, 0, "y").source == 1
    assert [multi.take_part_message(2, 0, "x").data for _ in range(2)] == [b"x-from-0", b"x-from-1"]
    assert multi.take_part_message(2, 0, "x") is None
    with pytest.raises(Refused, match="destination part 3"):
        multi.part_send(0, 0, 3, "x", b"")


def test_part_send_before_the_group_is_complete_is_refused():
    multi = job(strict(1), strict(1))
    multi.check_in(0, 0)
    multi.join(0, 0)
    with pytest.raises(NotAllowed, match="not complete yet"):
        multi.part_send(0, 0, 1, "t", b"")


def test_a_group_part_that_ends_without_joining_cannot_be_waited_for():
    multi = released_group(strict(1), strict(1))
    multi.join(0, 0)
    multi.part_ended(1, JobState.FINISHED)
    with pytest.raises(CannotComplete, match="part 1 ended without joining"):
        multi.structure(0)


def test_exchange_gives_every_group_part_every_text_in_part_order():
    multi = released_group(strict(1), free(1, comms_type="independent"), strict(1), free(1))
    assert multi.contribute(3, 0, "three") == 0
    assert multi.exchange_result(3, 0, 0) is None
    assert multi.contribute(0, 0, "zero") == 0
    assert multi.exchange_result(0, 0, 0) is None
    with pytest.raises(NotAllowed, match="independent"):
        multi.contribute(1, 0, "one")
    multi.contribute(2, 0, "two")
    result = multi.exchange_result(2, 0, 0)
    assert (result.part_index, result.indexes, result.texts) == (2, (0, 2, 3), ("zero", "two", "three"))
    # a second round is separate
    assert multi.contribute(0, 0, "again") == 1
    assert multi.exchange_result(0, 0, 1) is None
    assert multi.exchange_result(0, 0, 0).texts == ("zero", "two", "three")


# --------------------------------------------------------------------------- the rendezvous


@settings(max_examples=80, deadline=None)
@given(st.lists(st.lists(st.binary(max_size=6), min_size=1, max_size=3), min_size=1, max_size=3), st.data())
def test_rendezvous_aggregates_do_not_depend_on_the_order_of_registration(datas, data):
    multi = job(*(strict(len(items)) for items in datas), forward_rendezvous=data.draw(st.booleans()))
    steps = [("check", p, r) for p, items in enumerate(datas) for r in range(len(items))]
    steps += [("register", p, r) for p, items in enumerate(datas) for r in range(len(items))]
    steps = data.draw(st.permutations(steps))
    for kind, part, rank in steps:
        if kind == "check":
            multi.check_in(part, rank)
        else:
            # each process registers at its own rank: the aggregate is in rank order
            assert multi.register(part, rank, datas[part][rank], at_rank=rank) == rank
    for part, items in enumerate(datas):
        assert multi.rendezvous_result(part, 0, 1) == encode(tuple(items), 1)
    if not multi.description.forward_rendezvous:
        assert multi.rendezvous_result(0, 0, 2) is None
        for part in data.draw(st.permutations(range(len(datas)))):
            multi.register(part, 0, multi.rendezvous_result(part, 0, 1), level=2, at_rank=part)
    assert decode(multi.rendezvous_result(0, 0, 2), 2) == tuple(tuple(items) for items in datas)


def test_rendezvous_refusals():
    multi = job(strict(2), strict(1))
    assert multi.register(0, 1, b"x") == 0  # -1: the next free rank
    with pytest.raises(NotAllowed, match="already registered at level 1"):
        multi.register(0, 1, b"again")
    with pytest.raises(Refused, match="rank 0 of the level-1 rendezvous is already registered"):
        multi.register(0, 0, b"y", at_rank=0)
    assert multi.register(0, 0, b"y") == 1
    with pytest.raises(Refused, match="level is 1"):
        multi.register(0, 0, b"y", level=3)
    # level 2: rank 0 only, and only once the barrier is released
    with pytest.raises(NotAllowed, match="only the rank-0 process"):
        multi.register(0, 1, b"1 1 x", level=2)
    assert multi.register(0, 0, b"1 1 x", level=2) is None
    check_in_all(multi, 0, 1)
    with pytest.raises(Refused, match="expected"):
        multi.register(0, 0, b"not level one", level=2)
    assert multi.register(0, 0, b"1 1 x", level=2) == 0
    with pytest.raises(NotAllowed, match="already registered at level 2"):
        multi.register(0, 0, b"1 1 x", level=2)


def test_the_agent_forwards_a_part_rendezvous_when_asked():
    multi = job(strict(2), strict(1))
    multi.forward(0)
    multi.register(0, 0, b"a")
    multi.register(0, 1, b"b")
    multi.register(1, 0, b"c")
    check_in_all(multi, 0, 1)
    assert multi.rendezvous_result(1, 0, 2) is None  # part 1 neither registered nor forwarded
    multi.register(1, 0, multi.rendezvous_result(1, 0, 1), level=2, at_rank=1)
    assert multi.rendezvous_result(1, 0, 2) == b"2 2 1 a1 b1 1 c"


def test_a_rendezvous_that_can_never_complete_says_so():
    multi = job(loose(2), strict(1))
    multi.register(0, 0, b"a")
    multi.process_ended(0, 1)
    with pytest.raises(CannotComplete, match="process 1 ended without registering"):
        multi.rendezvous_result(0, 0, 1)
    check_in_all(multi, 1)
    multi.check_in(0, 0)
    assert multi.released
    multi.part_ended(1, JobState.FINISHED)
    with pytest.raises(CannotComplete, match="rank-0 process of part 1 ended without registering"):
        multi.rendezvous_result(0, 0, 2)
