"""Batch scripts: every user value reaches the program verbatim, and nothing injects.

The generated script is run by bash with ``srun`` replaced by a stub (on PATH) that drops
srun's options and execs the program, which prints its argv and environment as JSON. One
test submits through the real sbatch/srun when a cluster from scripts/slurm-up is around.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from hypothesis import given, settings, HealthCheck
from hypothesis import strategies as st

from proxy_agent.schedulers.batch.slurm import parse as sp
from proxy_agent.schedulers.batch.slurm import system as slurm_system
from proxy_agent.schedulers.batch import BatchScriptError
from proxy_agent.schedulers.batch.slurm.directives import job_script as render_script
from proxy_agent.schedulers.batch.slurm.directives import sbatch_options, submit_argv
from proxy_agent.service.jobs import JobSpec
from wait_support import scaled, wait_until_blocking

PRINTER = (
    "import json, os, sys; "
    "names = [n for n in os.environ.get('CHECK_ENV', '').split(',') if n]; "
    "print(json.dumps({'argv': sys.argv[1:], 'cwd': os.getcwd(), "
    "'env': {n: os.environ.get(n) for n in names}}))"
)

NASTY = [
    "plain",
    "with space",
    "  leading and trailing  ",
    "single ' quote",
    'double " quote',
    "'\"'\"'",
    "$(touch pwned-dollar)",
    "`touch pwned-backtick`",
    "$HOME",
    "${PATH}",
    "line1\nline2",
    "trailing newline\n",
    "tab\there",
    "carriage\rreturn",
    "*",
    "?",
    "[a-z]*",
    "~",
    "~root",
    "-n",
    "--",
    "--help",
    "",
    "non-ASCII héllo ✓ 日本語 🚀",
    "; rm -rf /tmp/x",
    "| cat /etc/passwd",
    "&& echo hi &",
    "\\",
    "back\\slash\\n",
    "a\\\nb",
    "!",
    "!!",
    "x=y",
    "#not a comment",
    "\x01\x02\x1f\x7f control",
    "<(echo sub)",
    "> redirect",
    "{a,b}",
    "%s %d %%",
    "x" * 5000,
]


@pytest.fixture
def stub_path(tmp_path):
    """A directory with an ``srun`` stub to put first on PATH."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    srun = bindir / "srun"
    srun.write_text(
        "#!/bin/bash\n"
        "# Test stand-in for srun: drop options up to '--', run the rest as given.\n"
        'while [ "$#" -gt 0 ] && [ "$1" != "--" ]; do shift; done\n'
        "shift\n"
        'exec "$@"\n'
    )
    srun.chmod(0o755)
    return bindir


def run_script(script: str, bindir, cwd, env_names=()):
    path = os.path.join(str(cwd), "job.sh")
    with open(path, "w", encoding="utf-8") as f:
        f.write(script)
    env = {
        "PATH": f"{bindir}:{os.environ.get('PATH', '/usr/bin:/bin')}",
        "CHECK_ENV": ",".join(env_names),
        "LC_ALL": "C.UTF-8",
        "HOME": str(cwd),
    }
    p = subprocess.run(["bash", path], cwd=str(cwd), env=env, capture_output=True, timeout=scaled(30))
    assert p.returncode == 0, p.stderr.decode(errors="replace")
    return json.loads(p.stdout.decode("utf-8"))


def test_nasty_arguments_arrive_verbatim(tmp_path, stub_path):
    spec = JobSpec(sys.executable, ["-c", PRINTER, *NASTY], num_procs=4)
    out = run_script(render_script(spec), stub_path, tmp_path)
    assert out["argv"] == NASTY
    assert not list(tmp_path.glob("pwned*")), "an argument was executed by the shell"


def test_nasty_environment_values_arrive_verbatim(tmp_path, stub_path):
    env = {f"V{i}": value for i, value in enumerate(NASTY)}
    env["_under_score"] = "ok"
    spec = JobSpec(sys.executable, ["-c", PRINTER], environment=env)
    out = run_script(render_script(spec), stub_path, tmp_path, env_names=list(env))
    assert out["env"] == env
    assert not list(tmp_path.glob("pwned*"))


def test_executable_and_working_dir_with_odd_names(tmp_path, stub_path):
    odd_dir = tmp_path / "work dir $(touch pwned) 'q' ✓"
    odd_dir.mkdir()
    exe = odd_dir / "my prog `x` -v"
    exe.symlink_to(sys.executable)
    spec = JobSpec(str(exe), ["-c", PRINTER, "arg"], working_dir=str(odd_dir))
    out = run_script(render_script(spec), stub_path, tmp_path)
    assert out["argv"] == ["arg"]
    assert out["cwd"] == str(odd_dir)
    assert not list(tmp_path.glob("pwned*")) and not list(odd_dir.glob("pwned*"))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    args=st.lists(
        st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"),
                max_size=40),
        max_size=6,
    )
)
def test_any_text_arguments_round_trip(tmp_path, stub_path, args):
    spec = JobSpec(sys.executable, ["-c", PRINTER, *args])
    out = run_script(render_script(spec), stub_path, tmp_path)
    assert out["argv"] == args


def test_program_line_uses_srun_with_task_count():
    script = render_script(JobSpec("/bin/hostname", num_procs=4, nodes=2, cpus_per_task=3))
    last = script.rstrip("\n").splitlines()[-1]
    assert last == "exec srun --ntasks=4 --nodes=2 --cpus-per-task=3 -- /bin/hostname"
    single = render_script(JobSpec("/bin/hostname")).rstrip("\n").splitlines()[-1]
    assert single == "exec srun --ntasks=1 -- /bin/hostname"
    assert script.startswith("#!/bin/bash\n")
    subprocess.run(["bash", "-n"], input=script.encode(), check=True)


def test_options_go_on_the_command_line_by_default():
    spec = JobSpec(
        "/bin/true", name='odd "name" | with $(x)', queue="long", account="proj",
        num_procs=2, nodes=1, cpus_per_task=2, memory=4096, wall_time=5400,
        working_dir="/tmp/a b", stdout_path="/tmp/o %j.txt", stderr_path="/tmp/e.txt",
        qos="high", exclusive=True,
    )
    argv = submit_argv(spec)
    assert argv == [
        "sbatch", "--parsable",
        '--job-name=odd "name" | with $(x)', "--partition=long", "--account=proj",
        "--ntasks=2", "--nodes=1", "--cpus-per-task=2", "--mem=4096", "--time=01:30:00",
        "--chdir=/tmp/a b", "--output=/tmp/o %j.txt", "--error=/tmp/e.txt",
        "--qos=high", "--exclusive",
    ]
    assert "#SBATCH" not in render_script(spec)
    assert submit_argv(spec, script_path="-job.sh")[-1] == "./-job.sh"
    assert submit_argv(spec, with_options=False) == ["sbatch", "--parsable"]
    assert [element for group in sbatch_options(spec) for element in group] == argv[2:]


def test_embedded_directives():
    spec = JobSpec("/bin/true", name="simple", num_procs=3, wall_time=600, queue="debug")
    lines = render_script(spec, embed_options=True).splitlines()
    directives = [ln for ln in lines if ln.startswith("#SBATCH")]
    assert directives == [
        "#SBATCH --job-name=simple", "#SBATCH --partition=debug", "#SBATCH --ntasks=3",
        "#SBATCH --time=00:10:00",
    ]
    # sbatch stops reading directives at the first command: they must all come first.
    first_command = next(i for i, ln in enumerate(lines) if ln and not ln.startswith("#"))
    assert all(lines.index(d) < first_command for d in directives)


@pytest.mark.parametrize("field", ["name", "queue", "account", "working_dir",
                                   "stdout_path", "stderr_path"])
@pytest.mark.parametrize("bad", ["a\nb", "x\n#SBATCH --uid=0", "cr\rhere", "nul\0"])
def test_newlines_in_options_are_refused_in_both_modes(field, bad):
    spec = JobSpec("/bin/true", **{field: bad})
    with pytest.raises(BatchScriptError, match=field):
        render_script(spec, embed_options=True)
    with pytest.raises(BatchScriptError):
        submit_argv(spec)


@pytest.mark.parametrize("value", ["a b", 'say "hi"', "it's", "x#y", "back\\slash"])
def test_values_sbatch_could_misread_are_refused_only_as_directives(value):
    spec = JobSpec("/bin/true", name=value)
    with pytest.raises(BatchScriptError, match="command line"):
        render_script(spec, embed_options=True)
    assert f"--job-name={value}" in submit_argv(spec)
    render_script(spec)  # fine without directives


@pytest.mark.parametrize("name", ["1ABC", "A-B", "A B", "", "A=B", "PATH;rm", "é"])
def test_environment_names_must_be_identifiers(name):
    with pytest.raises(BatchScriptError, match="identifier"):
        render_script(JobSpec("/bin/true", environment={name: "x"}))


@pytest.mark.parametrize(
    "kwargs",
    [
        {"memory": -1},
        {"num_procs": 0},
        {"nodes": 0},
        {"cpus_per_task": -1},
        {"native_options": ["script.sh"]},
        {"native_options": ["--comment=a\nb"]},
        {"begin_time": "2030-01-01\n#SBATCH --uid=0"},
        {"prologue": ["module load a\nmodule load b"]},
        {"queue": ""},
        {"executable": ""},
        {"arguments": ["a\0b"]},
    ],
)
def test_invalid_specs_are_refused(kwargs):
    base = {"executable": "/bin/true"}
    base.update(kwargs)
    with pytest.raises(BatchScriptError):
        render_script(JobSpec(**base))


@pytest.mark.parametrize("kwargs", [{"memory": "4G; rm -rf /"}, {"memory": "lots"}, {"wall_time": "1h"},
                                    {"wall_time": "$(date)"}])
def test_text_where_a_number_belongs_is_refused_when_the_job_is_described(kwargs):
    with pytest.raises(ValueError):
        render_script(JobSpec("/bin/true", **kwargs))


def test_jobspec_is_a_frozen_value():
    spec = JobSpec("/bin/echo", ["a", "b"], {"X": "1"})
    assert spec.arguments == ("a", "b")
    assert spec.env == {"X": "1"}
    assert spec == JobSpec("/bin/echo", ("a", "b"), [("X", "1")])
    with pytest.raises(Exception):
        spec.executable = "/bin/sh"  # type: ignore[misc]
    with pytest.raises(TypeError):
        JobSpec("/bin/echo", "not a list")


# --------------------------------------------------------------------------------------------
# Through the real sbatch and srun (scripts/slurm-up)
# --------------------------------------------------------------------------------------------


@pytest.mark.slurm
def test_arguments_survive_real_sbatch_and_srun(tmp_path):
    from slurm_support import require_cluster

    env = dict(os.environ, SLURM_CONF=require_cluster())
    tmp_path.chmod(0o755)
    out = tmp_path / "out.json"
    args = [a for a in NASTY if "\r" not in a][:30]
    spec = JobSpec(
        sys.executable, ["-c", PRINTER, *args], environment={"CHECK_ENV": "ODD", "ODD": "$(x) 'y' \"z\"\nw"},
        working_dir=str(tmp_path), name='batch test | "odd"', stdout_path=str(out),
        wall_time=120,
    )
    p = subprocess.run(submit_argv(spec), input=render_script(spec).encode(), env=env,
                       capture_output=True, timeout=scaled(30))
    assert p.returncode == 0, p.stderr
    job_id = sp.parse_sbatch_parsable(p.stdout.decode())

    def ended():
        q = subprocess.run(sp.scontrol_job_argv(job_id), env=env, capture_output=True, text=True, timeout=scaled(30))
        jobs = sp.parse_scontrol_jobs(q.stdout)
        return jobs if jobs and slurm_system.STATE_TABLE.map(jobs[0].state).final else None

    try:
        jobs = wait_until_blocking(ended, 120, what=f"SLURM job {job_id} to end")
    finally:
        subprocess.run(["scancel", job_id], env=env, capture_output=True, timeout=scaled(30))
    assert jobs[0].state == "COMPLETED", jobs[0].state
    assert jobs[0].name == 'batch test | "odd"'
    result = json.loads(out.read_text(encoding="utf-8"))
    assert result["argv"] == args
    assert result["env"] == {"ODD": "$(x) 'y' \"z\"\nw"}
    assert result["cwd"] == str(tmp_path)
