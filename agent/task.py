"""Reading a contest task package (and our optional manifest) without importing it.

Everything here is static: parsing files. Importing ``testcase_config`` needs
torch and runs the package's code, so that happens in a worker (see
``sandbox.probe_task``); the orchestrator stays light and safe.
"""

from __future__ import annotations

import ast
import csv
import hashlib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from optagent.contract import signature_names
from optagent.schema import Language

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

REQUIRED_FUNCTIONS = ("getNumOfTestcases", "getTestCaseSize", "genTestCase", "baseline", "check")
LOCALE_PREFERENCE = ("en", "en_US", "zh_CN")
STRATEGIES_DIR = "strategies"  # beside optagent.toml: laid out like agent/search/strategies/<family>/


class TaskError(Exception):
    """A package that cannot be used; the message is one line naming the file."""

    def __init__(self, path: Path | str, what: str):
        self.path = Path(path)
        super().__init__(f"{path}: {what}")


class Manifest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: Optional[str] = None
    family: Optional[str] = None
    outputs: Optional[list[int]] = None
    hooks: Optional[str] = None
    tolerance_factor: float = Field(default=8.0, gt=0)
    min_tolerance: float = Field(default=2e-3, gt=0)
    smoke: list[dict] = Field(default_factory=list)
    hidden: list[dict] = Field(default_factory=list)


@dataclass
class Doc:
    path: Path
    title: str
    type: str
    lang: Optional[str]
    body: str


@dataclass
class Starter:
    path: Path
    language: Language
    source: str


@dataclass
class TaskPackage:
    root: Path
    name: str
    title: str
    locale: str
    docs: list[Doc]
    starters: list[Starter]
    csvs: list[Path]
    manifest: Optional[Manifest]
    meta: dict = field(default_factory=dict)

    @property
    def config_path(self) -> Path:
        return self.root / "xpuoj_problem" / "testcase_config.py"

    @property
    def statement(self) -> str:
        return "\n\n".join(f"## {d.title}\n{d.body}" for d in self.docs if d.type != "codeSample")

    @property
    def contracts(self) -> dict[Language, str]:
        out: dict[Language, str] = {}
        for d in self.docs:
            if d.type == "codeSample" and d.lang:
                out[Language(d.lang)] = d.body
        return out

    @property
    def languages(self) -> list[Language]:
        """Languages with both a contract and a starter, contract order first."""
        have = {s.language for s in self.starters}
        ordered = list(self.contracts) + [s.language for s in self.starters]
        return list(dict.fromkeys(lang for lang in ordered if lang in have))

    @property
    def arg_names(self) -> list[str]:
        """run_kernel's parameter names in the contract (Python's first, else CUDA's); [] when none parses."""
        texts = sorted(self.contracts.items(), key=lambda kv: kv[0] is not Language.TRITON)
        for _, text in texts:
            names = signature_names(text)
            if names:
                return names
        return []

    @property
    def hooks_path(self) -> Optional[Path]:
        """The hooks module (optagent.toml task.hooks), loaded only in workers."""
        return self.root / self.manifest.hooks if self.manifest and self.manifest.hooks else None

    @property
    def strategies_dir(self) -> Optional[Path]:
        """The package's own strategy folder (strategy.toml + kernels), offered before the built-in ones."""
        folder = self.root / STRATEGIES_DIR
        return folder if folder.is_dir() else None

    def starter(self, language: Language) -> Starter:
        for s in self.starters:
            if s.language is language:
                return s
        raise TaskError(self.root / "starter", f"no {language.value} starter")

    def digest(self) -> str:
        """sha256 over every file of the package: a run refuses to resume on another one."""
        h = hashlib.sha256()
        for p in sorted(self.root.rglob("*")):
            if p.is_file() and "__pycache__" not in p.parts:
                h.update(str(p.relative_to(self.root)).encode())
                h.update(p.read_bytes())
        return h.hexdigest()


FRONT_MATTER = re.compile(r"\A---\s*\n(.*?)\n---\s*\n?(.*)\Z", re.S)
FENCE = re.compile(r"^```([^\n`]*)\n(.*?)^```", re.S | re.M)


def _front_matter(path: Path) -> Doc:
    text = path.read_text(encoding="utf-8")
    m = FRONT_MATTER.match(text)
    if not m:
        raise TaskError(path, "no front matter (--- sectionTitle/type ---)")
    fields: dict[str, str] = {}
    for line in m.group(1).splitlines():
        if ":" in line:
            key, _, value = line.partition(":")
            fields[key.strip()] = value.strip().strip("\"'")
    for key in ("sectionTitle", "type"):
        if key not in fields:
            raise TaskError(path, f"front matter lacks {key!r}")
    lang = fields.get("lang")
    if fields["type"] == "codeSample":
        if not lang:
            raise TaskError(path, "a codeSample document needs 'lang'")
        if lang not in {x.value for x in Language}:
            raise TaskError(path, f"unknown language {lang!r} (known: cuda, triton, tilelang)")
    return Doc(path, fields["sectionTitle"], fields["type"], lang, m.group(2).strip())


def detect_language(source: str) -> Optional[Language]:
    """Recognise a kernel's language from its content, not its file name."""
    if re.search(r"^\s*(import tilelang|from tilelang)", source, re.M):
        return Language.TILELANG
    if re.search(r"^\s*(import triton|from triton)", source, re.M):
        return Language.TRITON
    if "__global__" in source or re.search(r'extern\s+"C"', source) or "#include <cuda" in source:
        return Language.CUDA
    return None


def extract_code(markdown: str) -> Optional[str]:
    """The kernel in a Markdown starter: the largest fenced block that defines a kernel."""
    blocks = [body for _, body in FENCE.findall(markdown)]
    kernels = [b for b in blocks if "run_kernel" in b and detect_language(b)]
    defining = [b for b in kernels if "__global__" in b or "@triton.jit" in b or "T.prim_func" in b or "@jit" in b]
    pool = defining or kernels
    return max(pool, key=len) if pool else None


def _read_starter(path: Path) -> Starter:
    text = path.read_text(encoding="utf-8", errors="replace")
    if path.suffix.lower() == ".md":
        code = extract_code(text)
        if code is None:
            raise TaskError(path, "no fenced code block defining run_kernel")
        text = code
    lang = detect_language(text)
    if lang is None:
        raise TaskError(path, "unknown language (expected Triton, CUDA or TileLang source)")
    if "run_kernel" not in text:
        raise TaskError(path, "no run_kernel defined")
    return Starter(path, lang, text)


def _check_config_static(path: Path) -> None:
    if not path.is_file():
        raise TaskError(path, "missing (every package needs xpuoj_problem/testcase_config.py)")
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    except SyntaxError as e:
        raise TaskError(path, f"syntax error at line {e.lineno}: {e.msg}") from None
    defined = {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}
    missing = [f for f in REQUIRED_FUNCTIONS if f not in defined]
    if missing:
        raise TaskError(path, f"missing function(s): {', '.join(missing)}")


def _load_manifest(root: Path) -> Optional[Manifest]:
    path = root / "optagent.toml"
    if not path.exists():
        return None
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as e:
        raise TaskError(path, f"invalid TOML: {e}") from None
    flat = dict(data.get("task", {}))
    flat["smoke"] = data.get("smoke", [])
    flat["hidden"] = data.get("hidden", [])
    unknown = set(data) - {"task", "smoke", "hidden"}
    if unknown:
        raise TaskError(path, f"unknown section(s): {', '.join(sorted(unknown))}")
    try:
        manifest = Manifest.model_validate(flat)
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(x) for x in first["loc"])
        raise TaskError(path, f"{where}: {first['msg']}") from None
    if manifest.hooks and not (root / manifest.hooks).is_file():
        raise TaskError(path, f"hooks module {manifest.hooks!r} not found")
    if (manifest.smoke or manifest.hidden) and not manifest.hooks:
        raise TaskError(path, "smoke/hidden cases need a hooks module (task.hooks)")
    return manifest


def load_task(path: Path | str) -> TaskPackage:
    root = Path(path).resolve()
    if not root.is_dir():
        raise TaskError(root, "not a directory")
    problem = root / "xpuoj_problem"
    if not problem.is_dir():
        raise TaskError(problem, "missing (not a contest task package)")
    meta_path = problem / "meta.json"
    if not meta_path.is_file():
        raise TaskError(meta_path, "missing")
    try:
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise TaskError(meta_path, f"invalid JSON at line {e.lineno}: {e.msg}") from None
    _check_config_static(problem / "testcase_config.py")

    locales = [d for d in problem.iterdir() if d.is_dir() and not d.name.startswith(("_", "."))]
    if not locales:
        raise TaskError(problem, "no locale folder with the problem's documents (e.g. zh_CN/)")
    by_name = {d.name: d for d in locales}
    locale_dir = next((by_name[n] for n in LOCALE_PREFERENCE if n in by_name), sorted(locales)[0])
    docs = [_front_matter(p) for p in sorted(locale_dir.glob("*.md"))]
    if not docs:
        raise TaskError(locale_dir, "no documents (*.md)")
    title_file = locale_dir / "_title.txt"
    title = title_file.read_text(encoding="utf-8").strip() if title_file.exists() else root.name

    starter_dir = root / "starter"
    files = sorted(p for p in starter_dir.glob("*") if p.is_file()) if starter_dir.is_dir() else []
    if not files:
        raise TaskError(starter_dir, "no starter kernel")
    starters = [_read_starter(p) for p in files]
    csvs = sorted((root / "benchmark").rglob("*.csv")) if (root / "benchmark").is_dir() else []
    for c in csvs:
        try:
            with c.open(encoding="utf-8") as fh:
                next(csv.reader(fh))
        except (StopIteration, csv.Error, UnicodeDecodeError) as e:
            raise TaskError(c, f"unreadable CSV ({e or 'empty'})") from None

    manifest = _load_manifest(root)
    name = (manifest.name if manifest and manifest.name else None) or root.name
    task = TaskPackage(root, name, title, locale_dir.name, docs, starters, csvs, manifest, meta)
    missing_contract = [s.path.name for s in starters if s.language not in task.contracts]
    if not task.contracts:
        raise TaskError(locale_dir, "no interface contract (a codeSample document with lang)")
    if missing_contract and not task.languages:
        raise TaskError(starter_dir, f"no starter matches a contract language ({', '.join(missing_contract)})")
    return task
