"""What a submission becomes before the keeper starts it: the program found, the working
directory, the environment, checked before anything runs."""

from __future__ import annotations

import os
import stat
from typing import Dict, Optional, Tuple


from ..service.jobs import ErrorKind, JobSpec, SubmitError
from .local_records import Launch, MAX_PROCS

class LaunchPreparation:
    """How the local backend prepares a launch from a job spec."""

    # ------------------------------------------------------------------ submission

    def _prepare(self, spec: JobSpec) -> Launch:
        """Check a submission and work out the argv, directory and environment."""
        num_procs = spec.num_procs
        if num_procs < 1:
            raise SubmitError(f"the process count must be at least 1, got {num_procs}", ErrorKind.BAD_REQUEST)
        if num_procs > MAX_PROCS:
            raise SubmitError(
                f"the local scheduler starts at most {MAX_PROCS} processes per job, not {num_procs}",
                ErrorKind.BAD_REQUEST,
            )
        cwd = self._working_dir(spec.working_dir)
        base, base_size = self._environment()
        env = dict(base) if spec.environment else base  # not changed after this
        for name, value in spec.environment:
            if "\0" in name or "\0" in value:
                raise SubmitError(f"environment variable {name!r} contains a NUL character", ErrorKind.BAD_REQUEST)
            if not name or "=" in name:
                raise SubmitError(f"{name!r} is not an environment variable name", ErrorKind.BAD_REQUEST)
            env[name] = value
        path = find_executable(spec.executable, cwd, env.get("PATH", os.defpath))
        args = spec.arguments
        for arg in args:
            if "\0" in arg:
                raise SubmitError(f"program argument {arg!r} contains a NUL character", ErrorKind.BAD_REQUEST)
        # execve() takes argv and environment together up to ARG_MAX bytes: refuse now what
        # could never start (each string costs its bytes, a NUL and a pointer).
        size = sum(len(a.encode("utf-8", "surrogateescape")) + 9 for a in (path, *args))
        size += base_size if env is base else environment_size(env)
        if size > self._arg_max - 2048:
            raise SubmitError(
                f"the program's arguments and environment take {size} bytes; this system allows at most "
                f"{self._arg_max} bytes for both together",
                ErrorKind.BAD_REQUEST,
            )
        name = spec.name or os.path.basename(path)
        return Launch(path, [path, *args], cwd, env, num_procs, name)

    def _environment(self) -> Tuple[Dict[str, str], int]:
        """The agent's environment (what every job starts from) and its size for execve().
        Read at the first submission, when the agent has set itself up (it does not change
        its environment after that): a busy client submits hundreds of jobs a second."""
        if self._base_env is None:
            env = dict(os.environ)
            self._base_env = (env, environment_size(env))
        return self._base_env

    def _working_dir(self, given: Optional[str]) -> str:
        if not given:
            return self._default_cwd
        if "\0" in given:
            raise SubmitError("working directory contains a NUL character", ErrorKind.BAD_REQUEST)
        path = os.path.join(self._default_cwd, given)  # absolute paths stay as they are
        try:
            info = os.stat(path)
        except FileNotFoundError:
            raise SubmitError(f"working directory {path!r} does not exist") from None
        except NotADirectoryError:
            raise SubmitError(f"working directory {path!r} does not exist (a part of it is not a directory)") from None
        except OSError as exc:
            raise SubmitError(f"working directory {path!r} cannot be used: {exc.strerror}") from None
        if not stat.S_ISDIR(info.st_mode):
            raise SubmitError(f"working directory {path!r} is not a directory")
        if not os.access(path, os.X_OK):
            raise SubmitError(f"working directory {path!r} is not accessible (permission denied)")
        return path


def environment_size(env: Dict[str, str]) -> int:
    """Bytes an environment takes in execve(): each string, its NUL and its pointer."""
    return sum(len(k.encode("utf-8", "surrogateescape")) + len(v.encode("utf-8", "surrogateescape")) + 10
               for k, v in env.items())


def find_executable(executable: str, cwd: str, search_path: str) -> str:
    """The program to run; SubmitError naming the problem.

    A name without '/' is looked up on PATH (the job's PATH if its environment sets one);
    a path is relative to the job's working directory.
    """
    if not executable:
        raise SubmitError("no executable given", ErrorKind.BAD_REQUEST)
    if "\0" in executable:
        raise SubmitError("the executable's name contains a NUL character", ErrorKind.BAD_REQUEST)
    if "/" in executable:
        candidate = os.path.join(cwd, executable)
    else:
        candidate = look_up_in_path(executable, search_path, cwd)
    check_executable(candidate)
    return candidate


def look_up_in_path(name: str, search_path: str, cwd: str) -> str:
    not_executable = None
    for directory in search_path.split(os.pathsep):
        candidate = os.path.join(cwd, directory or ".", name)
        if os.path.isfile(candidate):
            if os.access(candidate, os.X_OK):
                return candidate
            not_executable = not_executable or candidate
    if not_executable is not None:
        raise SubmitError(
            f"executable {not_executable!r} is not executable (permission denied)"
        )
    raise SubmitError(f"executable {name!r} not found on PATH")


def check_executable(path: str) -> None:
    try:
        info = os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        raise SubmitError(f"executable {path!r} not found") from None
    except OSError as exc:
        raise SubmitError(f"executable {path!r} cannot be used: {exc.strerror}") from None
    if stat.S_ISDIR(info.st_mode):
        raise SubmitError(f"executable {path!r} is a directory, not a program")
    if not stat.S_ISREG(info.st_mode):
        raise SubmitError(f"executable {path!r} is not a regular file")
    if not os.access(path, os.X_OK):
        raise SubmitError(f"executable {path!r} is not executable (permission denied)")


