"""The schema of a strategy folder's ``strategy.toml``, and reading one (docs/task-format.md).

A folder is ``agent/search/strategies/<family>/`` (built in) or a task package's own
``strategies/``. Reading parses text only: the kernel files are candidates, evaluated in
the sandbox like any other, never imported here.
"""

from __future__ import annotations

import re
from pathlib import Path, PurePosixPath
from typing import Optional

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from optagent.schema import Language
from optagent.task import TaskError, detect_language

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

SPEC_FILE = "strategy.toml"
SIGNATURE = re.compile(r"def\s+run_kernel\s*\(([^)]*)\)|run_kernel\s*\(([^)]*)\)\s*\{", re.S)


class StrategyError(TaskError):
    """A strategy.toml (or a kernel it lists) that cannot be used; one line naming the file and field."""


def run_kernel_params(source: str) -> list[str]:
    """run_kernel's parameter names in a Triton/TileLang or CUDA source; [] when it defines none."""
    m = SIGNATURE.search(source)
    if not m:
        return []
    names = []
    for raw in (m.group(1) or m.group(2)).split(","):
        raw = re.sub(r"#.*", "", raw).split("=")[0].split(":")[0].strip()
        if raw:
            names.append(re.split(r"[\s*&]+", raw)[-1])
    return names


class StrategyEntry(BaseModel):
    """One ``[[strategy]]`` table: a complete contest submission in ``file``."""

    model_config = ConfigDict(extra="forbid")
    name: str = Field(min_length=1)
    file: str = Field(min_length=1)  # beside strategy.toml
    language: Language
    idea: str = Field(min_length=1)  # what the planner records as the step's idea
    # False keeps a kernel whose last change has not yet run on a GPU out of runs (a hang would
    # cost a run its candidate timeout); its tests and bench/ still use it
    gpu_checked: bool = True

    @field_validator("file")
    @classmethod
    def _inside(cls, v: str) -> str:
        p = PurePosixPath(v)
        if p.is_absolute() or ".." in p.parts or "\\" in v:
            raise ValueError("must name a file in the strategy folder (no absolute path, no '..')")
        return v


class StrategySpec(BaseModel):
    """A strategy folder's ``strategy.toml``."""

    model_config = ConfigDict(extra="forbid")
    # Built-in folders are offered to tasks of this family (optagent.toml task.family) or, failing
    # that, of this run_kernel signature; a package's own folder to its package, whatever they say.
    family: Optional[str] = Field(default=None, min_length=1)
    signature: list[str] = Field(default_factory=list)  # run_kernel's parameter names, in order
    strategy: list[StrategyEntry] = Field(min_length=1)

    @model_validator(mode="after")
    def _unique_names(self) -> "StrategySpec":
        names = [s.name for s in self.strategy]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"strategy names must be unique: {', '.join(twice)} listed twice")
        return self

    def offered_to(self, family: Optional[str], params: list[str]) -> bool:
        return (family is not None and self.family == family) or (bool(params) and self.signature == params)


def _where(loc: tuple, data: dict) -> str:
    """A pydantic error location as TOML readers write it: strategy[1] ("name").language."""
    parts: list[str] = []
    for i, x in enumerate(loc):
        if isinstance(x, int):
            parts[-1] += f"[{x}]"
            if loc[:i] == ("strategy",) and isinstance(data.get("strategy"), list) and x < len(data["strategy"]):
                entry = data["strategy"][x]
                if isinstance(entry, dict) and isinstance(entry.get("name"), str):
                    parts[-1] += f' ("{entry["name"]}")'
        else:
            parts.append(str(x))
    return ".".join(parts)


def _message(err: dict, data: dict) -> str:
    where = _where(tuple(err["loc"]), data)
    if err["type"] == "extra_forbidden":
        model = StrategySpec if len(err["loc"]) == 1 else StrategyEntry
        return f"{where}: unknown field (known: {', '.join(model.model_fields)})"
    msg = err["msg"].removeprefix("Value error, ")
    return f"{where}: {msg}" if where else msg


def read_spec(folder: Path) -> StrategySpec:
    """The folder's strategy.toml, validated, each listed kernel present and matching it."""
    path = folder / SPEC_FILE
    if not path.is_file():
        raise StrategyError(path, "missing (a strategy folder holds strategy.toml and its kernel files)")
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise StrategyError(path, f"invalid TOML: {e}") from None
    try:
        spec = StrategySpec.model_validate(data)
    except ValidationError as e:
        # an unknown field first: a misspelt one is why its real name then reads as missing
        errors = sorted(e.errors(), key=lambda err: err["type"] != "extra_forbidden")
        raise StrategyError(path, _message(errors[0], data)) from None
    for k, s in enumerate(spec.strategy):
        where = f'strategy[{k}] ("{s.name}").file'
        kernel = folder / s.file
        if not kernel.is_file():
            raise StrategyError(path, f"{where}: {s.file} not found beside strategy.toml")
        source = kernel.read_text(encoding="utf-8", errors="replace")
        params = run_kernel_params(source)
        if not params and "run_kernel" not in source:
            raise StrategyError(path, f"{where}: {s.file} defines no run_kernel")
        if spec.signature and params != spec.signature:
            raise StrategyError(path, f"{where}: {s.file}'s run_kernel({', '.join(params)}) is not the "
                                "signature listed in strategy.toml")
        found = detect_language(source)
        if found is not None and found is not s.language:
            raise StrategyError(path, f"{where}: {s.file} is {found.value} source, listed as {s.language.value}")
    return spec
