"""What the anchors' command lines have: a manual page each that says what ``--help`` says,
shell completion for bash and zsh installed by one command, and a configuration file whose
values the command line overrides."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys

import pytest

from agent_fixtures import agent_argv, console_argv, subprocess_env
from wait_support import scaled


def _run(argv, env=None, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env or subprocess_env(),
                          stdin=subprocess.DEVNULL)


# --------------------------------------------------------------------------- manual pages


def _help_entries(help_text: str):
    """(invocation, help) of every option and argument as ``--help`` printed it."""
    entries, current = [], None
    for line in help_text.splitlines():
        match = re.match(r"^  (\S.*?)(?:  +(\S.*))?$", line)
        if match:
            current = [match.group(1), match.group(2) or ""]
            entries.append(current)
        elif current is not None and line.startswith("    ") and line.strip():
            current[1] += " " + line.strip()
        else:
            current = None
    return [(invocation, " ".join(text.split())) for invocation, text in entries]


def _unroff(page: str) -> str:
    text = re.sub(r"\\f[BIR]", "", page).replace("\\-", "-").replace("\\&", "").replace("\\e", "\\")
    return " ".join(line for line in text.splitlines() if not line.startswith("."))


def _normalized(text: str) -> str:
    return " ".join(text.split())


@pytest.mark.parametrize("program, help_commands", [
    (agent_argv(), [[], ["jobs"], ["forget"], ["output"], ["stop"], ["completion"]]),
    (console_argv(), [[], ["deploy"]]),
])
def test_each_manual_page_says_what_help_says(program, help_commands):
    env = subprocess_env(COLUMNS="10000")  # one line per option in --help; one state directory for both
    page = _run(program + ["--man"], env=env)
    assert page.returncode == 0 and page.stdout.startswith(".TH "), page.stderr
    text = _normalized(_unroff(page.stdout))
    for command in help_commands:
        helped = _run(program + command + ["--help"], env=env)
        entries = _help_entries(helped.stdout)
        assert len(entries) >= 2 and any(i.startswith("-h") for i, _ in entries), helped.stdout
        for invocation, help_text in entries:
            assert invocation in text, invocation
            assert _normalized(help_text) in text, (invocation, help_text)
    if shutil.which("groff"):
        rendered = subprocess.run(["groff", "-man", "-Tutf8"], input=page.stdout, capture_output=True, text=True,
                                  timeout=scaled(60))
        assert rendered.returncode == 0 and rendered.stderr == "", rendered.stderr


# --------------------------------------------------------------------------- completion


def _bash_complete(script: str, *words: str, bin_dir: str = "") -> list:
    """What bash completes the last of ``words`` to, with ``script`` loaded (``bin_dir``
    first on the PATH)."""
    function = "_" + words[0].replace("-", "_")
    program = "\n".join([
        script,
        "COMP_WORDS=(" + " ".join(f"'{w}'" for w in words) + ")",
        f"COMP_CWORD={len(words) - 1}",
        f"{function}",
        'printf "%s\\n" "${COMPREPLY[@]}"',
    ])
    env = subprocess_env(PATH=os.pathsep.join(filter(None, [bin_dir, os.path.dirname(sys.executable),
                                                             os.environ.get("PATH", "")])))
    done = subprocess.run(["bash", "--norc", "--noprofile", "-c", program], capture_output=True, text=True,
                          timeout=scaled(60), env=env)
    assert done.returncode == 0, done.stderr
    return [line for line in done.stdout.splitlines() if line]


def test_bash_completes_options_values_commands_and_job_ids(tmp_path):
    script = _run(agent_argv("completion", "bash")).stdout
    assert "complete -o default -F _proxy_agent proxy-agent" in script and "_proxy_console proxy-console" in script
    assert _bash_complete(script, "proxy-agent", "--sch") == ["--scheduler"]
    assert _bash_complete(script, "proxy-agent", "--scheduler", "") == ["local", "sim", "slurm", "sge", "pbs"]
    assert _bash_complete(script, "proxy-agent", "") == ["jobs", "forget", "output", "stop", "completion"]
    assert sorted(_bash_complete(script, "proxy-agent", "jobs", "--st")) == ["--state", "--state-dir"]
    assert _bash_complete(script, "proxy-agent", "jobs", "--state", "RUN") == ["RUNNING"]
    assert _bash_complete(script, "proxy-agent", "--on-disconnect", "") == ["terminate", "keep"]
    assert _bash_complete(script, "proxy-console", "--un") == ["--unix"]
    assert "--spawn" in _bash_complete(script, "proxy-console", "--sp")
    (tmp_path / "statedir").mkdir()
    assert _bash_complete(script, "proxy-agent", "--state-dir", str(tmp_path / "state")) == [str(tmp_path / "statedir")]

    from proxy_agent.service.jobs import JobSpec
    from proxy_agent.service.store import JobStore

    store = JobStore(str(tmp_path / "statedir" / JobStore.FILE))
    for key in (31, 32):
        store.record_submission(key, "local", "local:default", JobSpec("/bin/true"))
    store.close()
    # the job ids `output` takes, from the job list of the state directory given (by the
    # proxy-agent found on the PATH: this checkout's)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "proxy-agent").write_text(f'#!/bin/sh\nexec "{sys.executable}" -m proxy_agent "$@"\n')
    (bin_dir / "proxy-agent").chmod(0o755)
    assert _bash_complete(script, "proxy-agent", "output", "--state-dir", str(tmp_path / "statedir"), "3",
                          bin_dir=str(bin_dir)) == ["31", "32"]


@pytest.mark.skipif(shutil.which("zsh") is None, reason="no zsh on this machine")
def test_zsh_completion_loads_and_describes_every_option():
    script = _run(agent_argv("completion", "zsh")).stdout
    agent_part, console_part = script.split("#compdef proxy-console")
    assert agent_part.startswith("#compdef proxy-agent")
    # _arguments stubbed out: the function runs in zsh and hands it every option's spec
    probe = "\n".join([
        "_arguments() { print -rl -- \"$@\"; }",
        agent_part.replace('_proxy_agent "$@"', ""),
        "words=(proxy-agent --x); CURRENT=2; _proxy_agent",
    ])
    done = subprocess.run(["zsh", "-f", "-c", probe], capture_output=True, text=True, timeout=scaled(60))
    assert done.returncode == 0, done.stderr
    specs = done.stdout.splitlines()
    assert any(s.startswith("--scheduler[") and s.endswith(":(local sim slurm sge pbs)") for s in specs), specs
    assert any(s.startswith("--state-dir[") and s.endswith(":_files -/") for s in specs)
    assert "1:command:(jobs forget output stop completion)" in specs
    check = subprocess.run(["zsh", "-n", "-c", console_part], capture_output=True, text=True, timeout=scaled(60))
    assert check.returncode == 0, check.stderr


def test_one_command_installs_both_shells_completion(tmp_path):
    env = subprocess_env(XDG_DATA_HOME=str(tmp_path / "share"))
    done = _run(agent_argv("completion", "--install"), env=env)
    assert done.returncode == 0, done.stderr
    share = tmp_path / "share"
    for path in (share / "bash-completion/completions/proxy-agent", share / "bash-completion/completions/proxy-console",
                 share / "zsh/site-functions/_proxy-agent", share / "zsh/site-functions/_proxy-console"):
        assert path.is_file() and str(path) in done.stdout
    installed = (share / "bash-completion/completions/proxy-console").read_text()
    assert _bash_complete(installed, "proxy-console", "--ss") == ["--ssh", "--ssh-config", "--ssh-port", "--ssh-option"]


# --------------------------------------------------------------------------- the configuration file


def _config(tmp_path, text: str) -> dict:
    directory = tmp_path / "config" / "proxy-agent"
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.ini").write_text(text)
    return subprocess_env(XDG_CONFIG_HOME=str(tmp_path / "config"))


def _nodes(env, *agent_args: str) -> int:
    run = _run(console_argv("-q", "-c", "nodes", "--spawn", *agent_argv(*agent_args)), env=env)
    assert run.returncode == 0, run.stderr
    return sum(1 for line in run.stdout.splitlines() if re.match(r"^\d+ ", line))


def test_the_configuration_file_sets_defaults_and_the_command_line_wins(tmp_path):
    state = tmp_path / "kept-here"
    env = _config(tmp_path, f"[agent]\nscheduler = sim\nstate-dir = {state}\nkeep-ended = 7d\n\n[sim]\nnodes = 5\n")
    assert _nodes(env) == 5  # the scheduler and its option from the file
    # the directory's service runs as it was started; the next one takes the command line's
    stopped = _run(agent_argv("stop"), env=env)
    assert stopped.returncode == 0 and str(state) in stopped.stdout, stopped.stderr
    assert _nodes(env, "--sim-nodes", "7") == 7  # the command line wins
    # the state directory is the file's, for the agent and for the job list
    run = _run(console_argv("-q", "-c", "submit --wait /bin/echo kept", "--spawn", *agent_argv("--scheduler", "local")),
               env=env)
    assert run.returncode == 0, run.stderr
    listed = _run(agent_argv("jobs", "--format", "name,state", "--no-header"), env=env)
    assert listed.stdout.split() == ["echo", "FINISHED"] and (state / "jobs.sqlite").exists()
    from proxy_agent.__main__ import configured as _configured, parse_arguments

    old = os.environ.get("XDG_CONFIG_HOME")
    os.environ["XDG_CONFIG_HOME"] = str(tmp_path / "config")
    try:
        args = parse_arguments(_configured(["--keep-ended", "2d"]))
        assert (args.scheduler, args.keep_ended, args.sim_nodes) == ("sim", 2 * 86400.0, 5)
        args = parse_arguments(_configured([]))
        assert args.keep_ended == 7 * 86400.0 and args.state_dir == str(state)
    finally:
        if old is None:
            del os.environ["XDG_CONFIG_HOME"]
        else:
            os.environ["XDG_CONFIG_HOME"] = old


def test_another_file_or_none_by_the_environment(tmp_path):
    env = _config(tmp_path, "[sim]\nnodes = 5\n")
    other = tmp_path / "other.ini"
    other.write_text("[sim]\nnodes = 3\n")
    assert _nodes({**env, "PROXY_AGENT_CONFIG": str(other)}, "--scheduler", "sim") == 3
    assert _run(agent_argv("stop"), env=env).returncode == 0  # the next launch starts the service anew
    assert _nodes({**env, "PROXY_AGENT_CONFIG": ""}, "--scheduler", "sim") == 16  # none: the built-in default


@pytest.mark.parametrize("text, message", [
    ("[agent]\nschedular = sim\n", "[agent] schedular is no option (did you mean scheduler?)"),
    ("[sim]\nnodes = many\n", "argument --sim-nodes: invalid int value: 'many'"),
    ("[agent]\nlisten = 4000\n", "[agent] listen is chosen on the command line only"),
    ("[agent]\nall-users = maybe\n", "a flag is yes or no"),
    ("[nowhere]\nx = 1\n", "[nowhere]: no such section"),
    ("scheduler = sim\n", "is not INI"),
])
def test_a_wrong_configuration_file_is_one_line_naming_it(tmp_path, text, message):
    env = _config(tmp_path, text)
    for argv in (agent_argv("--scheduler", "sim"), agent_argv("jobs")):
        if argv[-1] == "jobs" and "INI" not in message:
            continue  # the job list reads only the file's state-dir
        done = _run(argv, env=env)
        assert done.returncode == 2, done.stderr
        line = done.stderr.strip()
        assert "\n" not in line and message in line and str(tmp_path / "config") in line, line
