"""API keys and tokens out of the orchestrator's environment block.

/proc/PID/environ shows the environment a process was started with, whatever os.environ
says later, to every process of the same user allowed to inspect it. So the command line,
at start-up, moves each secret-looking variable into an anonymous memory file, starts
itself again (same process id) without them, reads them back and closes the file: from
then on they live only in this process's memory, where ``get`` finds them, and the
process is marked non-dumpable, which keeps its /proc files (environ, mem, fd) from other
processes of the user. Worker processes never see them (worker_command.child_env).
"""

from __future__ import annotations

import ctypes
import json
import os
import re
import sys
from typing import Optional

SECRET = re.compile(r"KEY|TOKEN|SECRET|PASSW|CREDENTIAL|AUTH", re.I)
FD_ENV = "OPTAGENT_SECRETS_FD"
API_KEY_ENVS = ("OPTAGENT_API_KEY", "OPENAI_API_KEY")  # the first one set is the LLM endpoint's key
PR_SET_DUMPABLE = 4
_hidden: dict[str, str] = {}


def get(name: str) -> Optional[str]:
    return _hidden.get(name) or os.environ.get(name)


def api_key() -> Optional[str]:
    return next((key for name in API_KEY_ENVS if (key := get(name))), None)


def environ() -> dict[str, str]:
    """os.environ with the moved secrets back in (for redaction)."""
    return {**os.environ, **_hidden}


secrets = environ  # redact's default, named apart from its parameter


def redact(text: str, environ: Optional[dict] = None) -> str:
    """``text`` with the values of this (orchestrator) process's secret-looking variables blanked."""
    for name, value in (secrets() if environ is None else environ).items():
        if SECRET.search(name) and len(value) >= 8:
            text = text.replace(value, "[redacted]")
    return text


def hide_secrets() -> None:
    """Call first in the command line's main: returns at once without secrets, and after the
    re-execution (which it performs) with them moved. A failure leaves everything as it was."""
    fd = os.environ.pop(FD_ENV, None)
    if fd is not None:
        with os.fdopen(int(fd), "rb") as f:
            _hidden.update(json.loads(f.read() or b"{}"))
        _not_dumpable()
        return
    found = {k: v for k, v in os.environ.items() if SECRET.search(k)}
    if not found or not sys.executable:
        return
    try:
        mem = os.memfd_create("optagent-secrets", 0)  # no MFD_CLOEXEC: the new image inherits it
        data = json.dumps(found).encode()
        while data:
            data = data[os.write(mem, data):]
        os.lseek(mem, 0, os.SEEK_SET)
        os.set_inheritable(mem, True)
        env = {k: v for k, v in os.environ.items() if k not in found}
        env[FD_ENV] = str(mem)
        sys.stdout.flush()
        sys.stderr.flush()
        os.execve(sys.executable, sys.orig_argv, env)
    except (OSError, AttributeError):  # no memfd or exec here: the sandbox still keeps workers out
        return


def _not_dumpable() -> None:
    try:
        ctypes.CDLL(None).prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
    except (OSError, AttributeError):
        pass
