"""What the orchestrator asks of a worker process, and how the worker answers.

The answer travels on a private pipe whose file descriptor only the worker's
harness knows; every message carries the per-run nonce. The candidate's own
stdout and stderr go to log files and are never parsed.
"""

from __future__ import annotations

import json
import os
from typing import Literal, Optional

from pydantic import Field

from optagent.schema import CaseKind, Device, Language, Record


class CaseSpec(Record):
    label: str
    kind: CaseKind
    index: Optional[int] = None  # contest cases: the 1-based index fed to getTestCaseSize
    params: Optional[dict] = None  # smoke/hidden cases: passed to hooks.make_case


class TimingSpec(Record):
    min_iters: int = 20
    max_iters: int = 200
    budget_s: float = 0.3  # per case and per timed callable
    input_sets: int = 3  # rotated fresh float inputs (keeps L2 and caches honest)
    warmup: int = 10  # GPU clocks and caches settle before the first timed call


class Job(Record):
    mode: Literal["candidate", "judge", "probe"]
    task_dir: str
    device: Device
    language: Optional[Language] = None
    source_path: Optional[str] = None
    cases: list[CaseSpec] = Field(default_factory=list)
    seed: int = 0
    nonce: str
    scratch: str
    timing: TimingSpec = Field(default_factory=TimingSpec)
    compiler: Optional[list[str]] = None
    compile_timeout_s: float = 180.0
    outputs_dir: Optional[str] = None  # where the candidate saves outputs for the judge
    samples: dict[str, list[dict]] = Field(default_factory=dict)  # judge: saved outputs per case
    source_fp8: bool = False  # judge: the candidate's source names an fp8 type (interpreter_faults)


class Channel:
    """Writer side of the result pipe (worker)."""

    def __init__(self, fd: int, nonce: str):
        self._fd = fd
        self._nonce = nonce

    def send(self, kind: str, **payload) -> None:
        line = json.dumps({"nonce": self._nonce, "type": kind, **payload}, default=str) + "\n"
        data = line.encode()
        while data:
            n = os.write(self._fd, data)
            data = data[n:]


def parse_line(line: bytes, nonce: str) -> Optional[dict]:
    """One line of the pipe as a message of this run, or None."""
    try:
        msg = json.loads(line)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None
    return msg if isinstance(msg, dict) and msg.get("nonce") == nonce else None


def parse_messages(raw: bytes, nonce: str) -> tuple[list[dict], int]:
    """Messages from the pipe, and how many lines were not the harness's (forged or garbled)."""
    out, dropped = [], 0
    for line in raw.decode(errors="replace").splitlines():
        try:
            msg = json.loads(line)
        except json.JSONDecodeError:
            dropped += 1
            continue
        if isinstance(msg, dict) and msg.get("nonce") == nonce:
            out.append(msg)
        else:
            dropped += 1
    return out, dropped
