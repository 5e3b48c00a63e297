"""SLURM's batch settings as sbatch options and script lines (no cluster needed)."""

from __future__ import annotations

import pytest

from proxy_agent.schedulers.batch.slurm import directives as slurm_options
from proxy_agent.schedulers.batch.slurm.backend import SlurmSystem
from proxy_agent.service.jobs import ErrorKind, JobSpec, SubmitError
from wait_support import scaled


def submit(**fields):
    argv, stdin = SlurmSystem().submit_command(JobSpec("/bin/echo", ["hi"], queue="debug", **fields))
    return argv, stdin.decode()


def refused(**fields) -> str:
    with pytest.raises(SubmitError) as error:
        submit(**fields)
    assert error.value.kind is ErrorKind.BAD_REQUEST
    return error.value.message


def test_every_batch_field_becomes_its_sbatch_option():
    argv, script = submit(account="proj", wall_time=3600, memory=4096, gpus=2, gres="gpu:a100:1,nvme",
                          qos="normal", constraint="fast&ib", exclusive=True, array="1-9:2,20%3",
                          native_options=("--comment=x y", "--mail-type", "END", "-w", "node1", "--requeue"))
    assert argv[:2] == ["sbatch", "--parsable"]
    for option in ("--account=proj", "--time=01:00:00", "--mem=4096", "--gpus=2", "--gres=gpu:a100:1,nvme",
                   "--qos=normal", "--constraint=fast&ib", "--exclusive", "--array=1-9:2,20%3",
                   "--open-mode=append", "--comment=x y", "--mail-type=END", "--nodelist=node1", "--requeue"):
        assert option in argv, option
    assert "--comment=x y" not in script  # options stay argv elements, out of the script


def test_no_batch_field_no_option():
    argv, _ = submit()
    assert not [a for a in argv if a.split("=")[0] in (
        "--gpus", "--gres", "--qos", "--constraint", "--exclusive", "--array", "--open-mode", "--account")]


def test_prologue_runs_before_the_program_as_written():
    _, script = submit(prologue=("module load gcc/12", "export A='b c'"), working_dir="/tmp")
    lines = script.splitlines()
    program = next(i for i, line in enumerate(lines) if line.startswith("exec "))
    assert lines.index("module load gcc/12") < program
    assert lines.index("export A='b c'") < program
    assert lines.index("cd -- /tmp || exit 1") < lines.index("module load gcc/12")


@pytest.mark.parametrize("fields, words", [
    (dict(prologue=("echo a\necho b",)), "prologue command"),
    (dict(prologue=("echo a\r",)), "prologue command"),
    (dict(gres="gpu:2\n#SBATCH --uid=0"), "gres"),
    (dict(gres="gpu 2"), "gres"),
    (dict(qos="high prio"), "qos"),
    (dict(qos=""), "qos is empty"),
    (dict(constraint="a;b"), "constraint"),
    (dict(array="1-x"), "array"),
    (dict(array="5-1"), "ends before it starts"),
    (dict(array="1-3%0"), "array"),
    (dict(gpus=-1), "gpus"),
])
def test_bad_values_are_refused_naming_the_field(fields, words):
    assert words in refused(**fields)


@pytest.mark.parametrize("option, words", [
    ("--uid=0", "the agent decides"),
    ("--wrap=id", "the agent decides"),
    ("--output=/tmp/x", "stdoutPath"),
    ("--time=5", "timeLimit"),
    ("-p", "queue"),
    ("--frobnicate=1", "--frobnicate=1: not an sbatch option"),
    ("-Z", "-Z: not an sbatch option"),
    ("comment", "not an sbatch option"),
    ("--requeue=yes", "takes no value"),
    ("--comment", "needs a value"),
])
def test_native_options_outside_sbatchs_list_are_refused(option, words):
    message = refused(native_options=(option,))
    assert words in message, message


def test_native_option_list_is_sbatchs_own():
    """Every option let through is one this SLURM's sbatch knows (when sbatch is here)."""
    import shutil
    import subprocess
    if not shutil.which("sbatch"):
        pytest.skip("no sbatch here")
    text = subprocess.run(["sbatch", "--help"], capture_output=True, text=True, timeout=scaled(30)).stdout
    known = {word.split("=")[0].split("[")[0].rstrip(",") for word in text.split() if word.startswith("--")}
    if len(known) < 50:
        pytest.skip("sbatch --help does not answer here")
    assert not set(slurm_options.SBATCH_OPTIONS) - known - {"--acctg-freq", "--hint", "--mem-bind", "--network",
                                                           "--ntasks-per-gpu", "--kill-on-invalid-dep"}


def test_no_line_of_the_prologue_is_read_as_a_directive():
    _, script = submit(prologue=("#SBATCH --uid=0", "echo ready"))
    lines = script.splitlines()
    first_command = next(i for i, line in enumerate(lines) if line.strip() and not line.startswith("#"))
    assert first_command < lines.index("#SBATCH --uid=0")
