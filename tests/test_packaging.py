"""A non-editable install carries everything optagent reads at run time, and declares what it imports.

The wheel is built from a copy of the checkout's packaging inputs (nothing is written
into the checkout) and unpacked, as pip would install it, into a folder outside it.
"""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

ROOT = Path(__file__).resolve().parents[1]
SKIP = {"__pycache__"}


def _shipped(folder: Path, prefix: str) -> set[str]:
    """Every file under ``folder`` as the wheel must name it (``prefix`` + relative path)."""
    return {prefix + p.relative_to(folder).as_posix() for p in folder.rglob("*")
            if p.is_file() and not SKIP & set(p.relative_to(folder).parts) and p.suffix != ".pyc"}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    src = tmp_path_factory.mktemp("src")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    for name in ("agent", "prompts"):
        shutil.copytree(ROOT / name, src / name, ignore=shutil.ignore_patterns("__pycache__"))
    out = tmp_path_factory.mktemp("wheel")
    # --no-build-isolation: the test environment's setuptools (the [test] extra), no download
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                           "-w", str(out), str(src)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    (whl,) = out.glob("optagent-*.whl")
    return whl


@pytest.mark.slow
def test_wheel_holds_every_module_template_and_data_file(wheel):
    names = {n for n in zipfile.ZipFile(wheel).namelist() if not n.startswith("optagent-")}
    expected = _shipped(ROOT / "agent", "optagent/") | _shipped(ROOT / "prompts", "optagent/prompt_templates/")
    assert expected - names == set(), "missing from the wheel"
    assert {"optagent/prompt_templates/system.j2", "optagent/report/templates/run_report.html.j2",
            "optagent/search/strategies/paged_decode/splitkv.cu", "optagent/worker/compat/flash_attn/__init__.py",
            "optagent/worker/native/timer.c"} <= names


@pytest.mark.slow
def test_installed_wheel_renders_prompts_and_finds_its_data_outside_the_checkout(wheel, tmp_path):
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    script = f"""
import optagent
from pathlib import Path
from optagent.llm import prompts
from optagent.report import run_page as report
from optagent.worker import harness
from optagent.search.planners.llm import build_messages
from optagent.search.planners.offline import STRATEGY_ROOT, load_strategies
from optagent.runs.view import PlannerContext
from optagent.schema import Language

site = Path({str(site)!r})
assert Path(optagent.__file__).is_relative_to(site), optagent.__file__
assert prompts.template_names() == {sorted(p.stem for p in (ROOT / "prompts").glob("*.j2"))!r}
bare = PlannerContext(task_name="t", title="T", statement="s", contract="c", language=Language.TRITON,
                      starter_source="x", best_source="x", best_result=None)
system, user = (m["content"] for m in build_messages(bare))
assert "```python" in system and "first attempt" in user
assert "did not apply" in prompts.render("edit_failed", kind="edit", error="e", failures=1, whole_file_next=False)
env = report.jinja_env()
for page in report.TEMPLATES.glob("*.j2"):
    env.get_template(page.name)
assert Path(report.TEMPLATES).is_relative_to(site) and STRATEGY_ROOT.is_relative_to(site)
assert load_strategies(Language.TRITON, "paged_decode", [])
assert (harness.COMPAT_DIR / "flash_attn" / "flash_attn_interface.py").is_file()
print("ok")
"""
    env = {k: v for k, v in os.environ.items() if k != "OPTAGENT_PROMPTS_DIR"}
    env["PYTHONPATH"] = str(site)  # ahead of the editable install's finder, as a wheel in site-packages would be
    done = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-3000:]


def _imported_roots(folder: Path) -> set[str]:
    roots = set()
    for path in folder.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                roots |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                roots.add(node.module.split(".")[0])
    return roots


DIST_NAME = {"yaml": "pyyaml", "PIL": "pillow"}  # import name -> distribution name, where they differ


def test_every_third_party_import_is_declared():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    spec = project["dependencies"]
    # an extra's packages count too (mcp: only `optagent mcp` imports it, and says how to install it)
    extras = [d for name, deps in project["optional-dependencies"].items() if name != "test" for d in deps]
    declared = {d.split(";")[0].split("[")[0].strip().split("<")[0].split(">")[0].split("=")[0].split("!")[0]
                .strip().lower() for d in spec + extras}
    third_party = {r for r in _imported_roots(ROOT / "agent")
                   if r not in sys.stdlib_module_names and r != "optagent"}
    missing = {DIST_NAME.get(r, r).lower() for r in third_party} - declared
    assert not missing, f"imported by agent/ but not in pyproject's dependencies: {sorted(missing)}"
    # the CPU interpreter's numpy, which no module imports
    numpy = next(d for d in spec if d.startswith("numpy"))
    assert "<2.4" in numpy
