"""Brokers end to end: the agent as a subprocess with local and simulated queues, asked over
the protocol, through the Python client and through the console."""

from __future__ import annotations

import os

import re
import subprocess

import pytest
import trio

from agent_fixtures import agent_argv, console_argv, subprocess_env
from wait_support import scaled
from proxy_agent.client import AgentClient
from proxy_agent.client.errors import CommandFailed
from proxy_agent.protocol.messages import CommandId
from proxy_agent.service.broker import Candidate
from test_broker import fastest_queue_directly

#: A loaded simulated cluster that holds still (no churn) and whose submitted jobs wait long.
SIM = ("--scheduler", "local,sim", "--sim-nodes", "8", "--sim-jobs", "300", "--sim-churn", "0",
       "--sim-time-scale", "1000")


async def _start(client: AgentClient, dialect: str) -> None:
    args = ["version=2.0", "baseId=1000"] + (["dialect=native"] if dialect == "native" else [])
    await client.reply(await client.send_command(CommandId.INIT, args), scaled(30))
    await client.model_def()
    await client.start_events()


def _label(queue) -> str:
    return f"{queue.get('backend')}:{queue.name}"


def _candidate(queue) -> Candidate:
    def number(name):
        value = queue.get(name)
        return int(value) if value is not None else None

    return Candidate(int(queue.id), _label(queue), queue.get("backend"), queue.name,
                     waiting=number("waitingJobs"), total_slots=number("totalSlots"),
                     free_slots=number("freeSlots"))


async def _brokered(client: AgentClient, job_id: str):
    """The job once its broker attributes are in the client's mirror."""
    return await client.wait_for(lambda: client.job(job_id).get("brokerReason") and client.job(job_id), scaled(30),
                                 description="the job's broker attributes")


@pytest.mark.parametrize("dialect", ["compat", "native"])
async def test_jobs_land_where_the_broker_says_and_the_client_sees_why(dialect):
    with trio.fail_after(scaled(60)):
        async with await AgentClient.spawn(agent_argv(*SIM), env=subprocess_env()) as client:
            await _start(client, dialect)
            queues = {_label(q): q for q in client.queues.values()}
            assert set(queues) == {"local:default", "sim:batch", "sim:debug", "sim:long"}
            # every queue shows its figures; the simulated queues differ in load
            for queue in queues.values():
                assert {"waitingJobs", "runningJobs", "totalSlots", "freeSlots"} <= set(queue.attributes)
            sim = [_candidate(queues[label]) for label in ("sim:batch", "sim:debug", "sim:long")]
            assert len({c.waiting for c in sim}) > 1
            expected = fastest_queue_directly(sim)[0]
            chosen = next(c for c in sim if c.label == expected)

            job = await _brokered(client, await client.submit("/bin/true", queue="sim:batch,sim:debug,sim:long",
                                                              broker="FastestQueue"))
            assert _label(client.element(job.parent)) == expected
            assert job.get("broker") == "FastestQueue" and job.get("brokerQueue") == expected
            assert job.get("brokerReason") == f"FastestQueue: {chosen.waiting} waiting of {chosen.total_slots} slots"

            # a job too big for this host goes to the next queue that can run it (Null)
            local_slots = int(queues["local:default"].get("totalSlots"))
            job = await _brokered(client, await client.submit("/bin/true", queue=["local:default", "sim:long"],
                                                              count=local_slots + 1))
            assert _label(client.element(job.parent)) == "sim:long"
            assert job.get("brokerReason") == (f"Null: first in the order given; left out local:default "
                                               f"({local_slots + 1} slots needed, the queue has {local_slots})")

            # by element id, comma-separated, as an IDE would send it
            ids = f"{queues['sim:long'].id},{queues['sim:debug'].id}"
            job = await _brokered(client, await client.submit("/bin/true", queue=ids, broker="Random:5"))
            assert _label(client.element(job.parent)) in ("sim:long", "sim:debug")
            assert job.get("brokerReason") == "Random: drawn at random (seed 5)"

            # no queue can run it: the error says why for each
            with pytest.raises(CommandFailed) as failure:
                await client.submit("/bin/true", queue="local:default,sim:debug", count=100000)
            assert failure.value.message == (
                f"no queue can run this job (local:default: 100000 slots needed, the queue has {local_slots}; "
                f"sim:debug: 100000 slots needed, the queue has {queues['sim:debug'].get('totalSlots')})"
            )
            with pytest.raises(CommandFailed) as failure:
                await client.submit("/bin/true", queue="local:default,sim:debug", broker="Quickest")
            assert "unknown broker 'Quickest'" in failure.value.message
            # the agent goes on serving
            job = await _brokered(client, await client.submit("/bin/true", queue="local:default,sim:debug",
                                                              broker="FastestQueue"))
            assert client.violations == []
            await client.quit()


async def test_the_agents_default_broker_and_benchmark_file(tmp_path):
    config = tmp_path / "brokers.ini"
    config.write_text("[sim:debug]\nspecint2000 = 900\n\n[sim:long]\nspecint2000 = 1850.5\n\n"
                      "[local:default]\nspecint2000 = 300\n")
    argv = agent_argv(*SIM, "--broker", "Benchmark", "--broker-config", str(config))
    with trio.fail_after(scaled(60)):
        async with await AgentClient.spawn(argv, env=subprocess_env()) as client:
            await _start(client, "compat")
            queues = {_label(q): q for q in client.queues.values()}
            assert queues["sim:long"].get("benchmark.specint2000") == "1850.5"
            assert queues["sim:batch"].get("benchmark.specint2000") is None
            # no queue named: the default broker picks among every queue
            job = await _brokered(client, await client.submit("/bin/true"))
            assert _label(client.element(job.parent)) == "sim:long"
            assert job.get("brokerReason") == "Benchmark: specint2000 1850.5"
            # the submission's own broker wins
            job = await _brokered(client, await client.submit("/bin/true", broker="Null"))
            assert _label(client.element(job.parent)) == "local:default"
            await client.quit()


@pytest.mark.parametrize("args, words", [
    (["--broker", "Quickest"], "proxy-agent: --broker: unknown broker 'Quickest'; brokers are Null, Random"),
    (["--broker", "no_such_module_here:Broker"], "cannot import no_such_module_here"),
    (["--broker-config", "/nonexistent/brokers.ini"], "cannot read the broker configuration /nonexistent/brokers.ini"),
])
def test_bad_broker_options_are_refused_in_one_line(args, words):
    run = subprocess.run(agent_argv("--stdio", *args), capture_output=True, text=True, timeout=scaled(30),
                         env=subprocess_env(), stdin=subprocess.DEVNULL)
    assert run.returncode == 2
    assert words in run.stderr and "Traceback" not in run.stderr
    assert len(run.stderr.strip().splitlines()) == 1


def test_the_console_submits_to_several_queues_with_a_broker():
    run = subprocess.run(
        console_argv("-c", "submit -q sim:batch,sim:debug,sim:long --broker FastestQueue /bin/true; "
                     "submit -q local:default,sim:long -b Null -n 100 /bin/true",
                     "--spawn", *agent_argv(*SIM)),
        capture_output=True, text=True, timeout=scaled(60), env=subprocess_env(), stdin=subprocess.DEVNULL,
    )
    assert run.returncode == 0, run.stderr
    first, second = re.findall(r"^submitted job \d+ \(\S+\) to (\S+) \((.*)\)$", run.stdout, re.M)
    assert first[0].startswith("sim:") and re.fullmatch(r"FastestQueue: \d+ waiting of \d+ slots", first[1])
    assert second[0] == "sim:long" and second[1].startswith("Null: first in the order given; left out local:default")


async def test_a_user_broker_as_the_agents_default_and_its_prints_stay_off_the_protocol(tmp_path):
    module = tmp_path / "chatty_broker.py"
    module.write_text(
        "print('imported')\n"
        "class Emptiest:\n"
        "    def __init__(self, argument):\n"
        "        print('created with', argument)\n"
        "        self.argument = argument\n"
        "    def rank(self, job, candidates):\n"
        "        print('ranking', len(candidates))\n"
        "        return sorted(candidates, key=lambda c: (c.waiting is None, c.waiting or 0))\n"
        "    def reason(self, job, candidate):\n"
        "        return f'{self.argument}: {candidate.waiting} waiting'\n"
    )
    argv = agent_argv(*SIM, "--broker", f"{module}:Emptiest:quietest")
    env = subprocess_env()
    with trio.fail_after(scaled(60)):
        async with await AgentClient.spawn(argv, env=env) as client:
            await _start(client, "compat")
            job = await _brokered(client, await client.submit("/bin/true", queue="sim:batch,local:default"))
            assert _label(client.element(job.parent)) == "local:default"
            assert job.get("broker") == f"{module}:Emptiest:quietest"
            assert job.get("brokerReason") == f"{module}:Emptiest:quietest: quietest: 0 waiting"
            assert client.violations == []
            await client.quit()
        # what the module prints goes to the log of the state directory's service
        log = os.path.join(env["XDG_STATE_HOME"], "proxy-agent", "agent.log")
        with open(log) as text:
            assert "imported" in text.read()
