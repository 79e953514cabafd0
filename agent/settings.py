"""Every OPTAGENT_* variable, in one place: one documented field each, read from the environment
by ``settings()`` and checked where it enters, so that a bad value is one line naming the
variable (``EnvError``, exit 2), never a traceback deep inside a run.

``settings()`` reads the environment once per set of OPTAGENT_* values (tests change them; a
run never does). The variables the parent sets for its worker processes (the wire: rlimits,
the lane's descriptor, the sandbox marker) are named here too, so no other module spells an
OPTAGENT_ name. API keys are not here: ``secret_env`` takes them out of the environment.
"""

from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path
from typing import Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

PREFIX = "OPTAGENT_"


class UserError(Exception):
    """Bad input: printed as one line, exit code 2, no traceback."""


class EnvError(ValueError):
    """A bad OPTAGENT_* value; the message is one line naming the variable."""


def _must(what: str) -> dict:
    return {"must": what}


_PRICE = _must("a price in USD per million tokens (a number >= 0)")


class Settings(BaseModel):
    """One field per user-facing variable; the variable is PREFIX + the field's name in capitals."""

    model_config = ConfigDict(frozen=True, allow_inf_nan=False)

    runs_dir: Optional[Path] = Field(None, description="where runs live (default ./runs); --runs-dir wins")
    cache: Path = Field(default_factory=lambda: Path.home() / ".cache" / "optagent",
                        description="measured ceilings, package probes, builds, the host-speed record")
    scratch: Path = Field(default_factory=lambda: Path.home() / ".cache" / "optagent" / "scratch",
                          description="the evaluations' scratch directories")
    isolation: Literal["auto", "bwrap", "landlock", "unshare", "none"] = Field(
        "auto", description="the OS isolation of worker processes; auto: bwrap, else Landlock, else none is "
        "started (unshare and none run candidates on a writable file system: only when named)",
        json_schema_extra=_must("one of auto, bwrap, landlock, unshare, none"))
    memory_limit_gib: Optional[float] = Field(
        None, ge=0, description="a worker's memory limit (0: none); default 8 GiB on CPU, half the memory on a GPU",
        json_schema_extra=_must("a number of GiB >= 0 (0: no memory limit)"))
    cpu_lanes: Optional[int] = Field(None, ge=1, description="timing lanes on the CPU (default 1; tests use more)",
                                     json_schema_extra=_must("a whole number of timing lanes, at least 1"))
    spares: Optional[int] = Field(
        None, ge=0, description="candidate processes a run's pool starts ahead on each GPU lane (default: as many as "
        "evaluations run on it at once, at least 2; 0: none, each candidate's process starts with it)",
        json_schema_extra=_must("a whole number of processes, at least 0"))
    settle_s: float = Field(
        0.0, ge=0, description="the longest a granted GPU lane waits for processes still starting for it (spares, "
        "the pool's judges) before its timed phase (default 0: none is waited for; 10 on a host with few cores)",
        json_schema_extra=_must("a number of seconds >= 0"))
    touch_gib: int = Field(16, ge=0, description="GiB of the host's memory a pool on a GPU writes once, in the "
                           "background, so that its processes get pages the host has backed (evaluation/host_memory.py; "
                           "at most a quarter of the memory available; 0: none)",
                           json_schema_extra=_must("a whole number of GiB, at least 0"))
    timer: Optional[str] = Field(None, description="python: never build the native timer, time in the worker's Python")
    graph_timing: bool = Field(False, description="1: also time each case's CUDA-graph replays (the gpu_us column; "
                               "never scored), about 2 s more a candidate on an H200",
                               json_schema_extra=_must("1 or 0"))
    ncu: Optional[str] = Field(None, description="the Nsight Compute program for --profile")
    nvcc: Optional[str] = Field(None, description="the CUDA compiler command (--compiler wins)")
    prompts_dir: Optional[Path] = Field(None, description="prompt templates to use instead of the installed ones")
    retry_attempts: Optional[int] = Field(None, ge=1, description="LLM request attempts (default 4)",
                                          json_schema_extra=_must("a whole number of attempts, at least 1"))
    retry_base_s: Optional[float] = Field(None, ge=0, description="the first retry's wait, doubled each time",
                                          json_schema_extra=_must("a number of seconds >= 0"))
    price_prompt: Optional[float] = Field(None, ge=0, description="USD per million prompt tokens",
                                          json_schema_extra=_PRICE)
    price_completion: Optional[float] = Field(None, ge=0, description="USD per million completion tokens",
                                              json_schema_extra=_PRICE)
    base_url: Optional[str] = Field(None, description="the OpenAI-compatible endpoint (--base-url wins)")
    model: Optional[str] = Field(None, description="the model's name (--model wins)")

    @field_validator("isolation", "timer", mode="before")
    @classmethod
    def _lower(cls, value):
        return value.lower() if isinstance(value, str) else value


def env_name(field: str) -> str:
    """The variable behind a Settings field (or a wire variable's short name)."""
    return PREFIX + field.upper()


# The wire: variables the parent sets for a worker process, never a user's.
RLIMITS_ENV = env_name("rlimits")  # the rlimits a worker sets on itself (evaluation/limits.py)
LANE_FD_ENV = env_name("lane_fd")  # the descriptor of a timing lane's gate (worker/lane.py)
REFEREE_FD_ENV = env_name("referee_fds")  # the worker's ends of its referee's pipes (evaluation/referee.py)
SANDBOX_ENV = env_name("sandbox")  # marks a worker's process tree, so a killed one's is found
LANDLOCK_ENV = env_name("landlock")  # the paths a worker under Landlock may write (worker/landlock.py)
# What a worker (and a Ray lane actor) inherits of the user's settings.
CACHE_ENV, SCRATCH_ENV, NVCC_ENV = env_name("cache"), env_name("scratch"), env_name("nvcc")
ISOLATION_ENV, MEMORY_ENV, CPU_LANES_ENV = env_name("isolation"), env_name("memory_limit_gib"), env_name("cpu_lanes")
NCU_ENV, TIMER_ENV, RUNS_DIR_ENV = env_name("ncu"), env_name("timer"), env_name("runs_dir")


def _snapshot() -> tuple[tuple[str, str], ...]:
    return tuple(sorted((k, v) for k, v in os.environ.items() if k.startswith(PREFIX)))


@lru_cache(maxsize=16)
def _read(items: tuple[tuple[str, str], ...]) -> Settings:
    raw = dict(items)
    values = {name: text.strip() for name in Settings.model_fields
              if (text := raw.get(env_name(name), "")).strip()}
    try:
        return Settings(**values)
    except ValidationError as e:
        name = str(e.errors()[0]["loc"][0])
        extra = Settings.model_fields[name].json_schema_extra or {}
        must = extra.get("must", "valid") if isinstance(extra, dict) else "valid"
        raise EnvError(f"{env_name(name)}={raw[env_name(name)]!r}: must be {must}") from None


def settings() -> Settings:
    """The settings now; EnvError (one line naming the variable) when one is bad."""
    return _read(_snapshot())
