"""Nsight Compute's raw CSV as the trusted parent reads it: a real H200 run's page (tests/fixtures/ncu),
the marker that splits it into cases, the roofline reading, and forged or garbled text that gives
a CsvError or no reading, never a crash."""

from __future__ import annotations

import csv
import io
from pathlib import Path

import pytest

from optagent.evaluation import ncu_csv
from optagent.evaluation.ncu_csv import Bound, CsvError, Launch, parse, short_name, split_cases, summarise
from optagent.evaluation.profiler import ncu_argv, read_profiles
from optagent.evaluation.sandbox import WorkerRun
from optagent.messages import CaseSpec, CaseStart, WorkerError
from optagent.profile_facts import ProfileStatus
from optagent.schema import CaseKind, Device

RAW = Path(__file__).resolve().parent / "fixtures" / "ncu" / "raw_h200.csv"
STALL = "smsp__average_warps_issue_stalled_{}_per_issue_active.ratio"


def page(rows: list[list[str]], metrics: list[str], units: list[str]) -> str:
    """A raw page as ncu writes it: its messages, the header, the units, one row per launch, all quoted."""
    out = io.StringIO()
    out.write("==PROF== Connected to process 7 (/usr/bin/python3.12)\n==PROF== Disconnected from process 7\n")
    w = csv.writer(out, quoting=csv.QUOTE_ALL, lineterminator="\n")
    ident = ["ID", "Process ID", "Process Name", "Host Name", "Kernel Name", "Context", "Stream", "Block Size",
             "Grid Size", "Device", "CC"]
    w.writerow(ident + metrics)
    w.writerow([""] * len(ident) + units)
    for i, (name, *values) in enumerate(rows):
        w.writerow([str(i), "7", "python3.12", "127.0.0.1", name, "1", "7", "(128, 1, 1)", "(64, 1, 1)", "0", "9.0",
                    *values])
    return out.getvalue()


METRICS = [ncu_csv.DURATION, ncu_csv.DRAM, ncu_csv.SM, ncu_csv.OCCUPANCY, STALL.format("long_scoreboard"),
           STALL.format("wait"), STALL.format("selected")]
UNITS = ["ns", "%", "%", "%", "inst", "inst", "inst"]
MARK = "void at::cuda::<unnamed>::spin_kernel(long)"


def test_a_real_h200_raw_page_parses_with_its_units_and_thousands_separators() -> None:
    launches = parse(RAW.read_text())
    assert [x.name for x in launches] == [
        "distribution_elementwise_grid_stride_kernel", "vectorized_elementwise_kernel",
        "distribution_elementwise_grid_stride_kernel", "nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT"]
    copy = launches[1].values
    assert copy[ncu_csv.DURATION] == pytest.approx(124.96)  # "124,960" ns
    assert (copy[ncu_csv.DRAM], copy[ncu_csv.SM], copy[ncu_csv.OCCUPANCY]) == (85.24, 6.61, 85.40)
    p = summarise(launches[1:2], floor_us=100.0)
    assert p.status is ProfileStatus.PROFILED and p.bound is Bound.MEMORY
    assert [s.reason for s in p.stalls] == ["long_scoreboard", "drain", "short_scoreboard"]  # never "selected"
    assert p.stalls[0].share == pytest.approx(181.91 / sum(
        v for k, v in copy.items() if k.startswith("smsp__") and k != STALL.format("selected")))
    assert p.floor_pct == pytest.approx(100.0 / 124.96 * 100)
    gemm = summarise(launches[3:])
    assert gemm.bound is Bound.COMPUTE and gemm.sm_pct == 90.20


def test_every_metric_asked_for_is_one_the_h200_reported() -> None:
    header = next(r for r in csv.reader(io.StringIO(RAW.read_text())) if r and r[0] == "ID")
    assert set(ncu_csv.METRICS) <= set(header)
    argv = ncu_argv(Path("/usr/local/cuda/bin/ncu"), Path("/s/ncu.csv"))
    assert argv[1:3] == ["--clock-control", "none"] and "--profile-from-start" in argv  # never lock the clocks


def test_markers_split_the_launches_into_cases_and_the_reading_weighs_kernels_by_duration() -> None:
    text = page([[MARK, "1,000", "0", "0", "1", "0", "0", "1"],
                 ["_split", "30,000", "90.00", "10.00", "40.00", "6.0", "1.0", "1.0"],
                 ["_combine", "10,000", "30.00", "30.00", "20.00", "0", "3.0", "1.0"],
                 [MARK, "1,000", "0", "0", "1", "0", "0", "1"],
                 ["_split", "2,000", "10.00", "20.00", "10.00", "0", "2.0", "1.0"]], METRICS, UNITS)
    first, second = split_cases(parse(text))
    assert [x.name for x in first] == ["_split", "_combine"] and [x.name for x in second] == ["_split"]
    p = summarise(first)
    assert p.duration_us == pytest.approx(40.0) and p.kernel_count == 2
    assert p.dram_pct == pytest.approx((30 * 90 + 10 * 30) / 40) and p.bound is Bound.MEMORY
    assert [(s.reason, round(s.share, 3)) for s in p.stalls] == [("long_scoreboard", round(180 / 240, 3)),
                                                               ("wait", round(60 / 240, 3))]
    assert [k.name for k in p.kernels] == ["_split", "_combine"]
    assert summarise(second).bound is Bound.LATENCY  # neither unit near its peak


@pytest.mark.parametrize("name, short", [
    ("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>>(int, T2, T3)",
     "vectorized_elementwise_kernel"),
    ("_attn_decode_kernel", "_attn_decode_kernel"),
    ("decode_split(const __half *, float *, int)", "decode_split"),
    ("void (anonymous namespace)::combine<64>(float *)", "combine"),
])
def test_kernel_names_are_cut_to_their_function(name: str, short: str) -> None:
    assert short_name(name) == short


def test_forged_values_are_no_reading_and_names_stay_short_and_printable() -> None:
    text = page([[MARK, "1", "0", "0", "0", "0", "0", "0"],
                 ["_k\x1b[31m" + "x" * 5000, "-5", "500", "nan", "1e999", "-1", "abc", "1"]], METRICS, UNITS)
    (group,) = split_cases(parse(text))
    (launch,) = group
    assert set(launch.values) == {STALL.format("selected")}  # the only number of the row that is one
    assert len(launch.name) <= ncu_csv.NAME_CHARS and "\x1b" not in launch.name
    p = summarise(group)
    assert p.status is ProfileStatus.PROFILED and p.dram_pct is None and p.bound is None and p.stalls == []


@pytest.mark.parametrize("text, why", [
    ('"ID","Process ID","Kernel Name","gpu__time_duration.sum"\n"0","1","k","5"\n', "no units row"),
    ('"ID","Kernel Name","Kernel Name"\n"",""\n', "twice"),
    ('"ID","Process ID"\n"0","1"\n', "garbled"),
    ("x" * (ncu_csv.MAX_BYTES + 1), "over 4 MiB"),
])
def test_a_garbled_or_oversized_page_is_a_csv_error(text: str, why: str) -> None:
    with pytest.raises(CsvError, match=why):
        parse(text)


def test_rows_that_do_not_fit_the_header_are_dropped() -> None:
    text = page([[MARK, "1", "0", "0", "0", "0", "0", "0"], ["_k", "2,000", "50", "50", "50", "1", "1", "1"]],
                METRICS, UNITS)
    text += '"9","7","python3.12","cut here\n"x","y"\n'
    assert [x.name for x in parse(text)] == ["spin_kernel", "_k"]
    assert parse("==PROF== nothing\n==WARNING== No kernels were profiled.\n") == []


def _run(*messages, tail: str = "") -> WorkerRun:
    return WorkerRun(messages=list(messages), stderr_tail=tail)


CASES = [CaseSpec(label="1", kind=CaseKind.CONTEST, index=1), CaseSpec(label="2", kind=CaseKind.CONTEST, index=2)]


def test_profiles_follow_the_order_the_process_ran_the_cases_in() -> None:
    text = page([[MARK, "1", "0", "0", "0", "0", "0", "0"], ["_a", "2,000", "90", "5", "50", "1", "1", "1"],
                 [MARK, "1", "0", "0", "0", "0", "0", "0"], ["_b", "2,000", "5", "90", "50", "1", "1", "1"]],
                METRICS, UNITS)
    got = read_profiles(CASES, _run(CaseStart(case="2"), CaseStart(case="1"), CaseStart(case="forged")), text,
                        Device.CUDA)
    assert got["2"].kernels[0].name == "_a" and got["1"].kernels[0].name == "_b"
    one_group = page([[MARK, "1", "0", "0", "0", "0", "0", "0"], ["_a", "2", "9", "5", "5", "1", "1", "1"]],
                     METRICS, UNITS)
    short = read_profiles(CASES, _run(), one_group, Device.CUDA)
    assert {p.status for p in short.values()} == {ProfileStatus.FAILED} and "1 groups for 2" in short["1"].reason


def test_what_went_wrong_becomes_a_status() -> None:
    perm = ("==ERROR== ERR_NVGPUCTRPERM - The user does not have permission to access NVIDIA GPU Performance "
            "Counters on the target device 0.\n")
    assert {p.status for p in read_profiles(CASES, _run(), perm, Device.CUDA).values()} == {ProfileStatus.NO_COUNTERS}
    crashed = read_profiles(CASES, _run(WorkerError(error="RuntimeError: boom")), "", Device.CUDA)
    assert crashed["1"].status is ProfileStatus.FAILED and "boom" in crashed["1"].reason
    empty = read_profiles(CASES, _run(), "==WARNING== No kernels were profiled.\n", Device.CUDA)
    assert empty["2"].status is ProfileStatus.FAILED and "no kernel" in empty["2"].reason
    other = read_profiles(CASES, _run(tail="==ERROR== unrecognised option '--bogus'\n"), "", Device.CUDA)
    assert other["1"].status is ProfileStatus.FAILED and other["1"].reason.startswith("ncu: unrecognised option")
    assert isinstance(Launch("x"), Launch)
