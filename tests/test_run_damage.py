"""Run files that survive damage: one-line errors naming the file, listings that go on past a damaged run,
killed runs shown as resumable, runs found by id, prefix or path, ids never cut. Driven through the real CLI
(``optagent.cli.main.main``); a real run killed with SIGKILL is in test_cli_runs."""

from __future__ import annotations

import hashlib
import json
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from optagent.cli.main import main

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "tests" / "fixtures" / "run_sample" / "20260721-093012-flashattn_decode-3f9a2c"
REPLAY = ROOT / "tests" / "fixtures" / "replay_decode.jsonl"
IDS = ("20260722-100000-flashattn_decode-aaaaaa", "20260722-100001-flashattn_decode-bbbbbb",
       "20260723-090000-flashattn_decode-cccccc")


@pytest.fixture(autouse=True)
def _wide(monkeypatch):
    monkeypatch.delenv("COLUMNS", raising=False)
    monkeypatch.delenv("OPTAGENT_RUNS_DIR", raising=False)


def make_runs(root: Path, ids=IDS) -> list[Path]:
    """Copies of the recorded sample run under new ids, each a replay run on CPU that resume can drive."""
    out = []
    for run_id in ids:
        d = root / run_id
        shutil.copytree(SAMPLE, d)
        cfg = json.loads((d / "config.json").read_text())
        cfg.update(run_id=run_id, task_dir=str(ROOT / cfg["task_dir"]), planner="replay", model=None,
                   base_url=None, replay_file=str(REPLAY), device="cpu")
        (d / "config.json").write_text(json.dumps(cfg, indent=2))
        out.append(d)
    return out


def cli(capsys, *args: str) -> tuple[int, str, str]:
    rc = main(list(args))
    got = capsys.readouterr()
    return rc, got.out, got.err


def tree_digest(d: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(d.rglob("*")):
        if p.is_file() and p.name != "lock":
            h.update(str(p.relative_to(d)).encode() + p.read_bytes())
    return h.hexdigest()


def one_error_line(err: str, needle: str) -> None:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("optagent: error: ") and needle in lines[0], err
    assert "Traceback" not in err and len(lines[0]) < 400


DAMAGES = {
    "truncated": lambda p: p.write_bytes(p.read_bytes()[: len(p.read_bytes()) // 2]),
    "empty": lambda p: p.write_bytes(b""),
    "not a record": lambda p: p.write_text('{"status": "NOPE", "steps": "x"}'),
    "not UTF-8": lambda p: p.write_bytes(b"\xff\xfe{}"),
}
WHAT = {"truncated": "not valid JSON (truncated?)", "empty": "empty file (truncated?)",
        "not a record": "not a valid", "not UTF-8": "not UTF-8 text"}
# the files each command needs; the rest of a run's records only `runs` checks
FILES = ["config.json", "state.json", "steps/0003/step.json", "steps/0003/result.json",
         "steps/0003/proposal.json", "best/result.json"]
SHOW_READS = {"config.json", "state.json", "steps/0003/step.json", "best/result.json"}


@pytest.mark.parametrize("damage", list(DAMAGES))
@pytest.mark.parametrize("name", FILES)
def test_a_damaged_file_is_one_line_naming_it_and_the_other_runs_still_list(tmp_path, capsys, name, damage):
    runs = tmp_path / "runs"
    good, bad = make_runs(runs, IDS[:2])
    DAMAGES[damage](bad / name)
    where = f"{bad / name}: {WHAT[damage]}"

    rc, out, err = cli(capsys, "runs", "--runs-dir", str(runs))
    assert rc == 0 and not err
    row = next(line for line in out.splitlines() if line.startswith("│ " + bad.name))
    assert "DAMAGED" in row
    assert next(line for line in out.splitlines() if line.startswith("│ " + good.name)).count("MAX_STEPS") == 1
    assert f"{bad.name}: DAMAGED: {where}" in out  # the note names the file and what is wrong

    rc, out, _ = cli(capsys, "runs", "--runs-dir", str(runs), "--json")
    listed = {r["run_id"]: r for r in json.loads(out)}
    assert listed[good.name]["error"] is None and listed[good.name]["status"] == "MAX_STEPS"
    assert listed[bad.name]["error"].startswith(where) and not listed[bad.name]["resumable"]

    rc, out, err = cli(capsys, "show", bad.name, "--runs-dir", str(runs))
    if name in SHOW_READS:
        assert rc == 2 and out == ""
        one_error_line(err, where)
    else:  # not needed to show the run, but resume or the report would trip on it: said, not hidden
        warnings = err.strip().splitlines()
        assert rc == 0 and len(warnings) == 1 and warnings[0].startswith(f"optagent: warning: {where}")

    if name in SHOW_READS:
        rc, out, err = cli(capsys, "report", bad.name, "--runs-dir", str(runs), "-o", str(tmp_path / "r.html"))
        assert rc == 2 and not (tmp_path / "r.html").exists()
        one_error_line(err, where)


def test_a_run_of_an_older_format_is_refused_by_its_version_and_left_as_it_was(tmp_path, capsys):
    runs = tmp_path / "runs"
    (run,) = make_runs(runs, IDS[:1])
    cfg = json.loads((run / "config.json").read_text())
    (run / "config.json").write_text(json.dumps({**cfg, "format_version": 1}, indent=2))
    before = tree_digest(run)
    for command in (["resume", run.name, "--quiet"], ["show", run.name], ["report", run.name, "-o", "-"]):
        rc, out, err = cli(capsys, *command, "--runs-dir", str(runs))
        assert rc == 2, command
        one_error_line(err, f"{run / 'config.json'}: a run of format version 1; this optagent reads version 2 "
                            "(runs made since step commits and rounds)")
    assert tree_digest(run) == before


@pytest.mark.parametrize("name", ["state.json", "steps/0003/step.json"])
def test_resume_of_a_damaged_run_names_the_file_and_writes_nothing(tmp_path, capsys, name):
    runs = tmp_path / "runs"
    (run,) = make_runs(runs, IDS[:1])
    DAMAGES["truncated"](run / name)
    before = tree_digest(run)
    rc, out, err = cli(capsys, "resume", run.name, "--force", "--runs-dir", str(runs), "--quiet")
    assert rc == 2
    one_error_line(err, f"{run / name}: not valid JSON (truncated?)")
    assert tree_digest(run) == before


def test_leaderboard_skips_a_damaged_run_with_one_warning(tmp_path, capsys):
    runs = tmp_path / "runs"
    good, bad, worse = make_runs(runs)
    DAMAGES["truncated"](bad / "best" / "result.json")
    DAMAGES["not UTF-8"](worse / "config.json")
    rc, out, err = cli(capsys, "leaderboard", "--runs-dir", str(runs))
    assert rc == 0 and good.name in out and bad.name not in out and worse.name not in out
    warnings = err.strip().splitlines()
    assert len(warnings) == 2
    assert warnings[0].startswith(f"optagent: warning: skipped damaged run {bad.name}: "
                                  f"{bad / 'best' / 'result.json'}: not valid JSON (truncated?): ")
    assert warnings[1] == (f"optagent: warning: skipped damaged run {worse.name}: {worse / 'config.json'}: "
                           "not UTF-8 text (bad byte at offset 0; damaged?)")

    rc, out, err = cli(capsys, "leaderboard", "--runs-dir", str(runs), "--json")
    rows = {r["run_id"]: r for r in json.loads(out)}
    assert rows[good.name]["error"] is None and rows[good.name]["geomean_speedup"] > 1
    assert rows[bad.name]["error"].startswith(f"{bad / 'best' / 'result.json'}: not valid JSON")
    assert rows[worse.name]["error"].startswith(f"{worse / 'config.json'}: not UTF-8")
    assert rows[bad.name]["geomean_speedup"] is None and set(rows[bad.name]) == set(rows[good.name])


# ---------------------------------------------------------------- finding a run


def test_a_run_is_found_by_id_path_or_unique_prefix(tmp_path, capsys, monkeypatch):
    runs = tmp_path / "runs"
    a, b, c = make_runs(runs)
    flag = ("--runs-dir", str(runs))

    def shown(arg: str) -> str:
        rc, out, err = cli(capsys, "show", arg, *flag)
        assert rc == 0, err
        return out.splitlines()[0]

    assert shown(a.name).startswith(f"run {a.name}:")
    assert shown(str(b)).startswith(f"run {b.name}:")  # absolute path
    monkeypatch.chdir(tmp_path)
    assert shown(f"runs/{b.name}/").startswith(f"run {b.name}:")  # relative path, trailing slash
    assert shown("20260723").startswith(f"run {c.name}:")  # unique prefix
    assert shown("aaaaaa").startswith(f"run {a.name}:")  # a unique part, as before
    monkeypatch.chdir(a)
    assert cli(capsys, "show", ".", *flag)[0] == 0  # from inside the run directory

    rc, out, err = cli(capsys, "show", "202607", *flag)
    assert rc == 2
    one_error_line(err, f"'202607' matches 3 runs: {a.name}, {b.name}, {c.name}")
    rc, out, err = cli(capsys, "show", "20260722", *flag)  # two share a prefix: listed, none picked
    one_error_line(err, f"'20260722' matches 2 runs: {a.name}, {b.name}")
    rc, out, err = cli(capsys, "show", "no-such-run", *flag)
    assert rc == 2
    one_error_line(err, "no such run")
    rc, out, err = cli(capsys, "show", str(tmp_path / "nowhere" / "x"), *flag)
    assert rc == 2
    one_error_line(err, f"{tmp_path / 'nowhere' / 'x'}: no such run directory")
    rc, out, err = cli(capsys, "show", str(runs), *flag)
    one_error_line(err, f"{runs}: not a run directory (no config.json)")


def test_report_and_resume_take_a_path_and_refuse_an_ambiguous_prefix(tmp_path, capsys):
    runs = tmp_path / "runs"
    a, b, _ = make_runs(runs)
    out_file = tmp_path / "a.html"
    rc, out, err = cli(capsys, "report", str(a), "-o", str(out_file))  # no --runs-dir needed with a path
    assert rc == 0 and a.name in out_file.read_text()

    before = tree_digest(b)
    rc, out, err = cli(capsys, "resume", "20260722", "--runs-dir", str(runs))
    assert rc == 2
    one_error_line(err, f"'20260722' matches 2 runs: {a.name}, {b.name}")
    assert not (a / "lock").exists() and not (b / "lock").exists() and tree_digest(b) == before
    rc, out, err = cli(capsys, "report", "20260722", "--runs-dir", str(runs), "-o", str(tmp_path / "x.html"))
    assert rc == 2 and not (tmp_path / "x.html").exists()


# ---------------------------------------------------------------- narrow terminals


@pytest.mark.parametrize("columns", ["60", "100", "200"])
def test_runs_never_cuts_an_id_in_a_narrow_terminal(tmp_path, capsys, monkeypatch, columns):
    runs = tmp_path / "runs"
    made = make_runs(runs)
    DAMAGES["truncated"](made[1] / "state.json")
    monkeypatch.setenv("COLUMNS", columns)
    rc, out, err = cli(capsys, "runs", "--runs-dir", str(runs))
    assert rc == 0
    listing = [line for line in out.splitlines() if not line.startswith("runs in ") and "DAMAGED:" not in line]
    assert max(len(line) for line in listing) <= int(columns)  # only the title and notes (paths) run on
    for run in made:  # whole, on one line, as a word of its own
        assert any(run.name in line.replace("│", " ").split() for line in out.splitlines()), out
    assert "…" not in out
    if columns == "200":
        assert out.count("┃ run ") == 1  # wide enough: the table


# ---------------------------------------------------------------- killed runs


def hold_lock(run: Path) -> subprocess.Popen:
    """A stand-in for a driving process: holds the run's lock until killed."""
    code = ("import sys, time; from pathlib import Path; from optagent.runs.store import RunStore; "
            "s = RunStore(Path(sys.argv[1])); s.lock(); print('locked', flush=True); time.sleep(600)")
    proc = subprocess.Popen([sys.executable, "-c", code, str(run)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "locked"
    return proc


def test_a_running_run_whose_driver_was_killed_is_interrupted_and_resumable(tmp_path, capsys):
    runs = tmp_path / "runs"
    (run,) = make_runs(runs, IDS[:1])
    state = json.loads((run / "state.json").read_text())
    (run / "state.json").write_text(json.dumps({**state, "status": "RUNNING"}))
    driver = hold_lock(run)
    try:
        rc, out, _ = cli(capsys, "runs", "--runs-dir", str(runs))
        assert "RUNNING" in out and "INTERRUPTED" not in out and "resumable" not in out
        rc, out, _ = cli(capsys, "show", run.name, "--runs-dir", str(runs))
        assert f"status RUNNING (pid {driver.pid})" in out.splitlines()[0]
        rc, out, err = cli(capsys, "resume", run.name, "--force", "--runs-dir", str(runs), "--quiet")
        assert rc == 2 and "another optagent process is driving this run" in err
    finally:
        driver.send_signal(signal.SIGKILL)
        driver.wait()
    rc, out, _ = cli(capsys, "runs", "--runs-dir", str(runs))
    assert "INTERRUPTED" in out and "RUNNING" not in out
    assert f"{run.name}: INTERRUPTED: resumable: optagent resume {run}" in out  # --runs-dir given: the path
    rc, out, _ = cli(capsys, "show", run.name, "--runs-dir", str(runs))
    assert f"status INTERRUPTED (resumable: optagent resume {run.name})" in out.splitlines()[0]
    rc, out, _ = cli(capsys, "runs", "--runs-dir", str(runs), "--json")
    (row,) = json.loads(out)
    assert row["status"] == "INTERRUPTED" and row["resumable"] and not row["driven"]
    assert row["state"]["status"] == "RUNNING"  # the record itself is left as it was


def test_a_reader_probing_the_lock_never_makes_a_driver_fail(tmp_path):
    from optagent.runs.store import RunStore

    (run,) = make_runs(tmp_path, IDS[:1])
    code = ("import sys; from pathlib import Path; from optagent.runs.store import RunStore; s = RunStore(Path(sys.argv[1]))\n"
            "for _ in range(3000): s.driven()")
    (run / "lock").touch()
    reader = subprocess.Popen([sys.executable, "-c", code, str(run)])
    try:
        for _ in range(200):
            store = RunStore(run)
            store.lock()
            store.unlock()
    finally:
        reader.wait(timeout=60)
    assert reader.returncode == 0
