"""Loading task packages: the seed unchanged, and broken copies of it, each with its one-line error."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from optagent.schema import Language
from optagent.task import TaskError, detect_language, extract_code, load_task


def optagent(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "optagent.cli.main", *args], capture_output=True, text=True,
                          timeout=timeout)


def test_seed_loads_unchanged(seed_dir):
    task = load_task(seed_dir)
    assert task.title == "FlashAttention KV Cache Decode"
    assert set(task.contracts) == {Language.CUDA, Language.TRITON, Language.TILELANG}
    assert {s.language for s in task.starters} == {Language.CUDA, Language.TRITON, Language.TILELANG}
    assert len(task.csvs) == 8
    assert task.manifest is None


def test_flashinfer_markdown_starter_is_extracted(seed_dir):
    md = (seed_dir.parent / "flashinfer_task_package" / "starter").glob("*.md")
    code = extract_code(next(md).read_text(encoding="utf-8"))
    assert code is not None and "__global__" in code and detect_language(code) is Language.CUDA


def test_seed_validates_with_the_standin(seed_dir):
    proc = optagent("task", "validate", str(seed_dir))
    assert proc.returncode == 0, proc.stderr
    assert "12 cases" in proc.stdout and "stand-in" in proc.stdout


def test_our_package_validates_and_shows(task_dir):
    proc = optagent("task", "validate", str(task_dir))
    assert proc.returncode == 0, proc.stderr
    shown = optagent("task", "show", str(task_dir))
    assert shown.returncode == 0, shown.stderr
    for needle in ("16384", "decode_triton.py (triton)", "decode_cuda.cu (cuda)", "smoke-1", "contract: cuda"):
        assert needle in shown.stdout


def _broken(seed_dir: Path, tmp_path: Path, edit) -> Path:
    copy = tmp_path / "pkg"
    shutil.copytree(seed_dir, copy)
    edit(copy)
    return copy


CONFIG = "xpuoj_problem/testcase_config.py"


def _rewrite(rel: str, old: str, new: str):
    def edit(root: Path) -> None:
        p = root / rel
        text = p.read_text(encoding="utf-8")
        assert old in text
        p.write_text(text.replace(old, new, 1), encoding="utf-8")
    return edit


BROKEN = {
    "missing config": (lambda r: (r / CONFIG).unlink(), "testcase_config.py: missing"),
    "syntax error": (_rewrite(CONFIG, "def getNumOfTestcases() -> int:", "def getNumOfTestcases( -> int:"),
                     "testcase_config.py: syntax error at line"),
    "missing function": (_rewrite(CONFIG, "def check(", "def check_renamed("), "missing function(s): check"),
    "no starter": (lambda r: shutil.rmtree(r / "starter"), "starter: no starter kernel"),
    "unknown language": (lambda r: (r / "starter" / "x.txt").write_text("def run_kernel(): pass\n"),
                         "x.txt: unknown language"),
    "bad meta": (lambda r: (r / "xpuoj_problem" / "meta.json").write_text("{oops"), "meta.json: invalid JSON"),
    "bad front matter": (lambda r: (r / "xpuoj_problem" / "zh_CN" / "02_输入格式.md").write_text("no front matter"),
                         "02_输入格式.md: no front matter"),
    "unknown contract language": (_rewrite("xpuoj_problem/zh_CN/01_接口约定.cuda.md", 'lang: "cuda"', 'lang: "rust"'),
                                  "unknown language 'rust'"),
    "bad manifest": (lambda r: (r / "optagent.toml").write_text("[task]\noutputs = 'x'\n"), "optagent.toml: outputs"),
}


@pytest.mark.parametrize("name", sorted(BROKEN))
def test_broken_copies_give_one_line_errors(seed_dir, tmp_path, name):
    edit, expected = BROKEN[name]
    pkg = _broken(seed_dir, tmp_path, edit)
    with pytest.raises(TaskError) as err:
        load_task(pkg)
    assert expected in str(err.value)
    proc = optagent("task", "validate", str(pkg))
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and expected in lines[0] and "Traceback" not in proc.stderr


DYNAMIC = {
    "genTestCase raises": (_rewrite(CONFIG, "        del testcase_sizes\n", "        raise ValueError('bad case')\n"),
                           "ValueError: bad case"),
    "import fails inside try": (_rewrite(CONFIG, "    import torch\n", "    import torch\n    import no_such_module\n"),
                                "not defined after import"),
    "zero cases": (_rewrite(CONFIG, "    return len(TESTCASES)", "    return 0"), "getNumOfTestcases() returned 0"),
}


@pytest.mark.parametrize("name", sorted(DYNAMIC))
def test_dynamic_failures_name_the_config(seed_dir, tmp_path, name):
    edit, expected = DYNAMIC[name]
    pkg = _broken(seed_dir, tmp_path, edit)
    proc = optagent("task", "validate", str(pkg))
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert "testcase_config.py" in lines[0] and expected in lines[0]


def test_not_a_package(tmp_path):
    proc = optagent("task", "validate", str(tmp_path))
    assert proc.returncode == 2 and "xpuoj_problem: missing" in proc.stderr


def test_probe_is_cached_for_evaluations_not_for_validation(task_dir, tmp_path, monkeypatch):
    from optagent.evaluation.evaluator import probe_task

    monkeypatch.setenv("OPTAGENT_CACHE", str(tmp_path))
    task = load_task(task_dir)
    first = probe_task(task, cached=True)
    assert len(first.cases) == 12 and list(tmp_path.glob("probe/*.json"))
    cached = next(tmp_path.glob("probe/*.json"))
    cached.write_text(first.model_copy(update={"cases": []}).model_dump_json())
    assert probe_task(task, cached=True).cases == []  # served from the cache
    assert len(probe_task(task).cases) == 12  # validation always runs the package's code
    cached.write_text('{"cases": [], "marker": 1}')  # not a probe (an older format): probed again
    assert len(probe_task(task, cached=True).cases) == 12
