"""Packages the planner has never seen (tests/fixtures/packages: no manifest, no hooks, naive starters):
knobs found without a declaration, generic transformations, derived CPU smoke cases, the estimated floor."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest

from optagent.schema import Language
from optagent.search.discover import MAX_THREADS, MAX_TILE
from optagent.search.generic import generic_candidates
from optagent.search.knobs import find_all_knobs, find_knobs, set_knobs
from optagent.search.transforms import autotune_single, cuda_restrict, whole_row

PACKAGES = Path(__file__).parent / "fixtures" / "packages"
NAMES = ["rmsnorm", "softmax", "silu_mul_quant"]

TRITON = '''import triton
import triton.language as tl


@triton.jit
def k(x_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(x_ptr + offs, 1.0, mask=offs < n)


def run_kernel(x, n):
    k[(triton.cdiv(n, 128),)](x, n, BLOCK=128, num_warps=4)
    k[((n + 127) // 128, 264)](x, n, BLOCK=128)
'''

CUDA = '''__global__ void __launch_bounds__(256) k(float* x, int n) {}
template <int ITEMS> __global__ void t(const float* a, float* b) {}
extern "C" void run_kernel(float* x, int n) {
    k<<<(n + 255) / 256, 256>>>(x, n);
    t<64, 4><<<n, 64, 0>>>(x, x);
}
'''


def starter(name: str, lang: str) -> str:
    return (PACKAGES / name / "starter" / f"naive-{lang}.txt").read_text()


def test_triton_launch_constexpr_is_a_knob_and_the_grid_moves_with_it():
    knobs = {k.name: k for k in find_all_knobs(TRITON)}
    assert knobs["BLOCK"].value == 128 and knobs["BLOCK"].group == "k"
    assert knobs["num_warps"].group == "k"
    assert knobs["grid@k"].value == 264
    assert max(knobs["BLOCK"].values) <= MAX_TILE and min(knobs["BLOCK"].values) >= 16
    out = set_knobs(TRITON, {"BLOCK": 256, "BLOCK#2": 512, "num_warps": 8})
    assert "k[(triton.cdiv(n, 256),)](x, n, BLOCK=256, num_warps=8)" in out
    assert "k[((n + 511) // 512, 264)](x, n, BLOCK=512)" in out
    ast.parse(out)
    # strategies keep to what they declare: the launch literals are find_all_knobs' alone
    assert "BLOCK" not in {k.name for k in find_knobs(TRITON)}


def test_autotune_configs_are_knobs_and_each_config_a_candidate():
    src = TRITON.replace("@triton.jit", "@triton.autotune(configs=[triton.Config({'BLOCK': 64}, num_warps=2), "
                         "triton.Config({'BLOCK': 256}, num_warps=8)], key=['n'])\n@triton.jit")
    names = {k.name for k in find_all_knobs(src)}
    assert {"config.BLOCK", "config.BLOCK#2"} <= names
    alone = list(autotune_single(src))
    assert len(alone) == 2 and "configs=[triton.Config({'BLOCK': 256}, num_warps=8)]" in alone[1][0]
    for s, _ in alone:
        ast.parse(s)


def test_cuda_block_literal_template_and_launch_bounds():
    knobs = {k.name: k for k in find_all_knobs(CUDA)}
    assert knobs["threads@k"].values == (32, 64, 128, 256, 512, 1024)
    assert all(max(k.values) <= MAX_THREADS for k in knobs.values() if k.name.startswith("threads"))
    out = set_knobs(CUDA, {"threads@k": 512, "threads@t": 128, "template1@t": 8})
    assert "__launch_bounds__(512)" in out and "k<<<(n + 511) / 512, 512>>>" in out
    assert "t<128, 8><<<n, 128, 0>>>" in out  # the template argument equal to the block size moves with it
    assert "threads@rmsnorm_kernel" not in knobs
    rms = {k.name: k for k in find_all_knobs(starter("rmsnorm", "CUDA"))}
    assert rms["THREADS"].values == (32, 64, 128, 256, 512, 1024)  # a #define, over its role's range


def test_joint_moves_double_tile_and_warps_together():
    ideas = [idea for _, idea, _ in generic_candidates(TRITON, Language.TRITON)]
    assert "joint: BLOCK 128 -> 256 with num_warps 4 -> 8" in ideas
    assert "joint: BLOCK 128 -> 64 with num_warps 4 -> 2" in ideas
    assert "knob BLOCK: 128 -> 256" in ideas and "knob BLOCK: 128 -> 64" in ideas


@pytest.mark.parametrize("name", NAMES)
def test_transforms_apply_to_every_package_and_still_parse(name):
    tri = starter(name, "Triton")
    rows = list(whole_row(tri))
    assert len(rows) == 1 and "next_power_of_2" in rows[0][0] and "num_warps=8" in rows[0][0]
    ast.parse(rows[0][0])
    cu = starter(name, "CUDA")
    (restricted, _), = cuda_restrict(cu)
    assert restricted.count("__restrict__") == len(re.findall(r"\*\s*\w+\s*[,)]", cu.split("extern")[0]))
    assert restricted.count("{") == cu.count("{") and restricted.count("(") == cu.count("(")
    assert list(cuda_restrict(restricted)) == []  # applied once, then nothing


def test_a_transformation_that_does_not_fit_yields_nothing():
    assert list(whole_row(TRITON)) == []  # the tile divides the grid: no row loop
    assert list(cuda_restrict("int main() { return 0; }")) == []


class _Norm:
    """A package's config whose baseline writes one fresh output from two inputs."""

    @staticmethod
    def baseline(x, w, out, n, m):
        out.copy_((x * w).to(out.dtype))
        return [x, w, out, n, m]


def test_estimated_floor_counts_every_tensor_once():
    torch = pytest.importorskip("torch")
    from optagent.worker.arg_roles import detect_roles
    from optagent.worker.floor_estimate import estimated_bytes

    x, w, out = torch.ones(4, 8, dtype=torch.bfloat16), torch.ones(8), torch.zeros(4, 8, dtype=torch.int8)
    roles = detect_roles(_Norm, [x, w, out, 4, 8], ["x", "w", "out", "n", "m"])
    assert estimated_bytes(_Norm, [x, w, out, 4, 8], roles) == 4 * 8 * 2 + 8 * 4 + 4 * 8
    assert estimated_bytes(_Norm, [x, x, out, 4, 8], roles) == 64 + 32  # an argument passed twice is one tensor


def test_offline_planner_tries_the_launch_tile_when_the_whole_row_loses():
    from optagent.runs.view import Attempt, PlannerContext
    from optagent.search.planners.offline import OfflinePlanner

    src = starter("softmax", "Triton")
    planner = OfflinePlanner(Language.TRITON, family=None, params=["x", "out", "n_rows", "n_cols"])
    ctx = PlannerContext("t", "t", "", "", Language.TRITON, src, src, None)
    ideas = []
    for i in range(1, 6):
        p = planner.propose(ctx)
        ideas.append(p.idea)
        ctx.attempts.append(Attempt(i, p.idea, "NOT_BETTER", None, None, p.source))
    assert ideas[0].startswith("transform: whole row per tile: BLOCK_SIZE = next_power_of_2(n_cols)")
    assert "joint: BLOCK_SIZE 64 -> 128 with num_warps 2 -> 4" in ideas
    assert "knob BLOCK_SIZE: 64 -> 128" in ideas


def test_transformed_starter_passes_a_cpu_eval(tmp_path, capsys):
    """A transformed Triton starter of a manifest-less package is judged on a derived smoke case."""
    from optagent.cli.main import main

    src = tmp_path / "k.py"
    src.write_text(next(whole_row(starter("softmax", "Triton")))[0])
    rc = main(["eval", str(PACKAGES / "softmax"), str(src), "--device", "cpu", "--json", "--quiet"])
    result = json.loads(capsys.readouterr().out)
    assert rc == 0 and result["status"] == "PASSED"
    # a smoke case from each kind of contest case (each row length), the smallest first
    assert [c["case"] for c in result["cases"]] == ["smoke-1", "smoke-2", "smoke-3", "smoke-4"]
    assert result["cases"][0]["sizes"].split(",")[0].endswith(" 2x4096")  # 4096x4096 cut to 2 rows: a quarter of the elements each


def test_cpu_run_on_a_manifest_less_package(tmp_path, capsys):
    """optagent run on a package without optagent.toml: derived smoke case, generic candidates, judged."""
    from optagent.cli.main import main

    rc = main(["run", str(PACKAGES / "rmsnorm"), "--device", "cpu", "--max-steps", "3", "--runs-dir",
               str(tmp_path), "--json", "--quiet"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0, out
    run = Path(out["path"])
    steps = sorted(run.glob("steps/*/step.json"))
    ideas = [json.loads(p.read_text())["idea"] for p in steps]
    assert any("whole row per tile: BLOCK" in i for i in ideas), ideas
    # on the CPU no timing replaces the best: the whole-row kernel is judged, and passes, as a tree node
    rows = [json.loads(p.read_text()) for p in steps]
    assert any("whole row per tile: BLOCK" in s["idea"] and s["outcome"] == "PASSED" for s in rows), rows
    config = json.loads((run / "config.json").read_text())
    assert config["language"] == "triton"


def test_the_knobs_of_the_kernel_that_does_the_work_come_first():
    """run_kernel launches a zero-fill and the router: the router's knobs are tried before the zero-fill's."""
    from optagent.search.generic import kernel_work

    src = (PACKAGES / "moe_router" / "starter" / "naive-Triton.txt").read_text()
    assert kernel_work(src, "router_kernel") > 10 * kernel_work(src, "zero_kernel") > 0
    ideas = [idea for _, idea, _ in generic_candidates(src, Language.TRITON)]
    assert ideas[0] == "knob num_warps#2: 1 -> 2"  # router_kernel's launch
    assert ideas.index("knob num_warps#2: 1 -> 2") < ideas.index("knob BLOCK: 32 -> 64")
