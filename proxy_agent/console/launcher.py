"""Entry point of the single-file agent, ``proxy-agent.pyz``.

``scripts/build-pyz`` copies this module into the archive as its ``__main__.py``.  It runs
first, under whatever ``python3`` the archive's ``#!/usr/bin/env python3`` line finds, and
that may be far older than the code in the archive (RHEL 8's is 3.6).  So this module is
written to parse and run on old interpreters: no f-strings, no annotations, no imports
beyond ``os`` and ``sys`` until the version check has passed.

What it does:

* the running Python is new enough: run the agent (``proxy-agent.pyz [OPTIONS]``), the
  console (``proxy-agent.pyz console [OPTIONS]``), or print one line about the archive and
  its interpreter (``proxy-agent.pyz --pyz-info``);
* too old: look on PATH for ``python3.14`` down to ``python3.9`` (only versions that are
  new enough) and re-execute the archive with the first one found;
* none found (or the one found turns out too old as well): say in one line which version
  is needed and how to get one, and exit with status 1.

:func:`plan` makes that decision from plain values, so it can be checked without owning an
old interpreter.
"""

import os
import sys

#: The oldest Python the archive's contents run on.  scripts/build-pyz rewrites this line
#: with the value it computed for the bundled packages.
REQUIRED = (3, 9)
#: Interpreter names tried when the running one is too old, preferred first.
CANDIDATES = tuple("python3.%d" % minor for minor in range(14, 8, -1))
#: Set in the environment of a re-executed launcher, so that it never loops.
REEXEC_MARK = "PROXY_AGENT_PYZ_REEXEC"
#: Exit status when no usable interpreter exists.
EXIT_NO_PYTHON = 1

RUN = "run"
REEXEC = "reexec"
FAIL = "fail"


def version_text(version):
    return ".".join(str(part) for part in version)


def candidate_version(name):
    """``python3.11`` -> (3, 11); None for a name that does not carry a version."""
    if not name.startswith("python"):
        return None
    parts = name[len("python"):].split(".")
    if len(parts) != 2 or not all(part.isdigit() for part in parts):
        return None
    return (int(parts[0]), int(parts[1]))


def find_candidates(path_value, names=CANDIDATES):
    """[(name, full path)] for every executable ``name`` on ``path_value``, in ``names`` order."""
    found = []
    directories = [d for d in (path_value or "").split(os.pathsep) if d]
    for name in names:
        for directory in directories:
            full = os.path.join(directory, name)
            if os.path.isfile(full) and os.access(full, os.X_OK):
                found.append((name, full))
                break
    return found


def how_to_get(required):
    wanted = version_text(required)
    return (
        "load a newer one (e.g. 'module load python' or 'module avail python' on clusters "
        "with environment modules) or install one (e.g. 'dnf install python3.11' / "
        "'apt install python3'), then run the file with it (e.g. 'python%s proxy-agent.pyz') "
        "or put it on PATH as python%s" % ("3.11" if required <= (3, 11) else wanted, wanted)
    )


def plan(current, required, found, reexecuted_from=None, executable=""):
    """What to do: ``(RUN, None)``, ``(REEXEC, path)`` or ``(FAIL, one-line message)``.

    ``current``: the running interpreter's (major, minor); ``required``: the oldest that
    will do; ``found``: [(name, path)] of interpreters on PATH, preferred first (see
    :func:`find_candidates`); ``reexecuted_from``: set when this run is already a
    re-execution (the interpreter that started it), so it must not try again.
    """
    current = tuple(current[:2])
    required = tuple(required[:2])
    if current >= required:
        return (RUN, None)
    here = "this is Python %s%s" % (version_text(current), " (%s)" % executable if executable else "")
    if reexecuted_from is not None:
        return (
            FAIL,
            "proxy-agent needs Python %s or newer; %s, started because %s was too old: %s"
            % (version_text(required), here, reexecuted_from, how_to_get(required)),
        )
    for name, path in found:
        version = candidate_version(name)
        if version is not None and version >= required:
            return (REEXEC, path)
    return (
        FAIL,
        "proxy-agent needs Python %s or newer; %s and no python3.N >= %s is on PATH: %s"
        % (version_text(required), here, version_text(required), how_to_get(required)),
    )


def archive_path():
    """The archive this launcher runs from (the file named on the command line)."""
    here = os.path.dirname(os.path.abspath(__file__))
    if os.path.isfile(here):
        return here
    return os.path.abspath(sys.argv[0])


def ensure_python(environ=None):
    """Return when the running Python will do; re-execute or exit otherwise."""
    environ = os.environ if environ is None else environ
    reexecuted_from = environ.get(REEXEC_MARK)
    action, detail = plan(
        sys.version_info[:2],
        REQUIRED,
        find_candidates(environ.get("PATH", "")),
        reexecuted_from,
        sys.executable or "",
    )
    if action == RUN:
        # The mark has done its job; jobs the agent starts must not inherit it.
        environ.pop(REEXEC_MARK, None)
        return
    if action == REEXEC:
        environ[REEXEC_MARK] = "%s %s" % (sys.executable or "python", version_text(sys.version_info[:2]))
        argv = [detail, archive_path()] + sys.argv[1:]
        try:
            os.execv(detail, argv)
        except OSError as exc:
            detail = "proxy-agent: cannot start %s: %s" % (detail, exc.strerror or exc)
            sys.stderr.write(detail + "\n")
            sys.exit(EXIT_NO_PYTHON)
    sys.stderr.write(detail + "\n")
    sys.exit(EXIT_NO_PYTHON)


def pyz_info():
    import proxy_agent

    return "proxy-agent %s python %s %s archive %s" % (
        proxy_agent.__version__,
        ".".join(str(part) for part in sys.version_info[:3]),
        sys.executable,
        archive_path(),
    )


def main():
    ensure_python()
    args = sys.argv[1:]
    if args[:1] == ["--pyz-info"]:
        sys.stdout.write(pyz_info() + "\n")
        return 0
    if args[:1] == ["console"]:
        from proxy_agent.console import main as console_main

        return console_main(args[1:])
    from proxy_agent.launch import entry

    return entry(args)


if __name__ == "__main__":
    sys.exit(main())
