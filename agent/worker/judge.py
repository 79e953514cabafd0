"""The trusted side of an evaluation: verdicts on saved outputs, and package probing.

The judge never loads candidate code. It rebuilds each case's inputs from the
seeds the candidate process used, computes the reference itself and compares
every saved output (the package's inputs, fresh inputs, and the last timed
call on every input set) with it.
"""

from __future__ import annotations

import math
import os
from typing import Optional

import torch

from optagent.worker.arg_roles import ArgRoles
from optagent.worker.case_store import CaseStore
from optagent.worker.floor_estimate import estimated_bytes
from optagent.worker.compare import integer_mismatch, run_check, untouched_masks, written_problem
from optagent.worker.digests import checksum, outputs_digest
from optagent.worker.harness import TaskRuntime, clone_args, float_bases, refresh_floats, run_baseline
from optagent.worker.interpreter_faults import blame_interpreter
from optagent.worker import sample_file
from optagent.messages import (CaseSpec, Channel, Done, ExpectedSample, Finding, Job, Phase, PhaseStarted, Probed,
                               ProbedCase, ProbedExtra, Sample, Verdict)
from optagent.schema import CaseKind, Device, FloorKind, Status


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    o, r = out.double(), ref.double()
    denom = float(torch.linalg.vector_norm(r))
    num = float(torch.linalg.vector_norm(o - r))
    return num / denom if denom > 0 else num


def _rebuild(rt: TaskRuntime, case: CaseSpec, sample: Sample) -> tuple[list, object]:
    args, sizes = rt.make_args(case, sample.base_seed)
    if sample.refresh_seed is not None:
        refresh_floats(args, sample.refresh_seed, float_bases(args, set(rt.written(args))))
    return args, sizes


def _as_asked(samples: list[Sample], expected: list[ExpectedSample]) -> tuple[list[Sample], Optional[Finding]]:
    """The samples to judge, those the parent asked for first (with its seeds), or why one is missing."""
    by_name = {s.name: s for s in samples}
    first = []
    for e in expected:
        s = by_name.pop(e.name, None)
        if s is None or (s.base_seed, s.refresh_seed) != (e.base_seed, e.refresh_seed):
            if e.name.startswith("timed-call"):
                why = f"timed call {e.name.removeprefix('timed-call')} were not saved as the harness's timer asked"
            else:
                why = f"the {e.name} run were not saved as the harness asked"
            return [], Finding(status=Status.REJECTED, reason=f"the outputs of {why}")
        first.append(s)
    return first + list(by_name.values()), None


def _inputs_changed(saved: dict, args: list, roles: ArgRoles) -> Optional[Finding]:
    """The post-call inputs' checksums the candidate process saved, against the judge's own rebuild's."""
    inputs = saved.get("inputs")
    if not isinstance(inputs, dict):
        return Finding(status=Status.REJECTED, reason="the inputs after the call were not saved as the harness asked")
    changed = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor) and i not in roles.written
               and inputs.get(i) != checksum(a)]
    if changed:
        return Finding(status=Status.REJECTED, reason=roles.tampered(changed))
    return None


def _verdict(rt: TaskRuntime, case: CaseSpec, sample: Sample, check_inputs: bool = False,
             digest: Optional[str] = None) -> Finding:
    """Compare one saved output with the reference (and its inputs with the rebuilt ones); `digest`: the
    one the harness told the referee as the call returned, which the saved outputs must still have."""
    if sample.fd is None:  # the parent opens each saved output itself; what it could not open is refused
        return Finding(status=Status.REJECTED, reason=f"the saved outputs ({sample.name}) are not a regular file "
                       "the harness saved in the outputs directory")
    try:
        saved = sample_file.read(sample.fd, rt.device, sample.sha256)
    except sample_file.SampleFileError as e:
        why = "were rewritten after the harness saved them" if e.rewritten else f"are not as the harness saves them: {e}"
        return Finding(status=Status.REJECTED, reason=f"the saved outputs ({sample.name}) {why}")
    finally:
        os.close(sample.fd)
    args, sizes = _rebuild(rt, case, sample)
    roles = rt.roles(args)
    outs = roles.written
    if digest is not None and outputs_digest({i: v for i, v in saved.items() if isinstance(i, int)}) != digest:
        return Finding(status=Status.REJECTED, reason=f"the saved outputs ({sample.name}) are not what the call left "
                       "when it returned (their digest differs from the one told to the referee then)")
    where = f"{sample.name} inputs"
    changed = _inputs_changed(saved, args, roles) if check_inputs else None
    if changed:
        return changed
    found: dict = {"rel_err": 0.0, "max_abs_err": 0.0, "tolerance": None}
    manifest = rt.manifest
    base = None  # the package's baseline on these inputs, run once for the reference and the check
    if rt.hooks is not None and manifest is not None:
        refs64 = rt.hooks.reference(clone_args(args), torch.float64)
    else:
        base = run_baseline(rt.config, clone_args(args))
        refs64 = [base[i] for i in outs]
    untouched = untouched_masks(rt.config, args, base, roles) if base is not None else {}
    mismatches = []  # integer arguments that differ: the package's check() has the last word on them
    for j, i in enumerate(outs):
        if i not in saved:
            return Finding(status=Status.INCORRECT, reason=f"{roles.label(i)} missing ({where})")
        out, ref = saved[i], refs64[j].to(saved[i].device)
        if out.shape != ref.shape or out.dtype != args[i].dtype:
            return Finding(status=Status.INCORRECT, reason=f"{roles.label(i)} is {out.dtype} {tuple(out.shape)}, "
                           f"expected {args[i].dtype} {tuple(args[i].shape)}")
        problem = written_problem(roles, i, out, ref, args[i], untouched.get(i), where)
        if problem:
            return Finding(status=Status.INCORRECT, reason=problem)
        err = rel_err(out, ref)  # for an integer output too: a wrong one must not read 0.0 (the error column)
        found["rel_err"] = max(found["rel_err"], err)
        found["max_abs_err"] = max(found["max_abs_err"], float((out.double() - ref.double()).abs().max()))
        mismatch = integer_mismatch(roles, i, out, ref, where)
        if mismatch:
            mismatches.append(mismatch)
            continue
        if rt.hooks is not None and manifest is not None:
            low = rt.hooks.reference(clone_args(args), args[i].dtype)[j]
            tol = max(manifest.min_tolerance, manifest.tolerance_factor * rel_err(low.to(ref.device), ref))
            found["tolerance"] = tol
            if err > tol:
                return Finding(**found, status=Status.INCORRECT, reason=f"relative error {err:.2e} exceeds "
                               f"{tol:.2e} in {roles.label(i)} ({where}; tolerance = {manifest.tolerance_factor:g} x a "
                               "same-dtype PyTorch computation)")
    if mismatches and case.kind is not CaseKind.CONTEST:  # no check() to state another rule: exact
        return Finding(**found, status=Status.INCORRECT, reason=mismatches[0])
    if case.kind is CaseKind.CONTEST:
        ok, printed = run_check(rt.config, sizes, args, {i: saved[i].to(args[i].device) for i in outs}, base)
        if not ok:
            detail = printed.strip().splitlines()
            return Finding(**found, status=Status.INCORRECT,
                           reason=f"the task's check() failed ({where})" + (f": {detail[-1][:200]}" if detail else "")
                           + (f"; {mismatches[0]}" if mismatches else ""))
    return Finding(**found, status=Status.PASSED)


def judge(job: Job, chan: Channel) -> None:
    rt = TaskRuntime(job.task_dir, job.device)
    if job.stored_cases:  # slow cases read from, and kept in, the cache (worker/case_store.py)
        rt.store = CaseStore(rt.task, rt.device, write=True)
    bandwidth: Optional[float] = None
    tflops: Optional[float] = None
    if job.device is Device.CUDA and rt.hooks is None:
        from optagent.worker.bench import measured_bandwidth_gbs

        bandwidth = measured_bandwidth_gbs()  # for the estimated floor
    if job.device is Device.CUDA and rt.hooks is not None:
        from optagent.worker import host_speed
        from optagent.worker.bench import measured_bandwidth_gbs, measured_matmul_tflops

        bandwidth = measured_bandwidth_gbs() if rt.hooks.measures_bytes else None
        # The host-speed record too: the judge alone may write the cache (evaluation/isolation.py).
        host_speed.usual_probe_us(min(host_speed.probe_us() for _ in range(200)))
        tflops = measured_matmul_tflops() if rt.hooks.measures_flops else None
    for case in job.cases:
        chan.send(PhaseStarted(phase=Phase.JUDGING, case=case.label))
        expected = job.expected.get(case.label, [])
        samples, worst = _as_asked(job.samples.get(case.label, []), expected)
        inputs = {e.name for e in expected if e.inputs}
        digests = {e.name: e.digest for e in expected if e.digest}
        agg: dict = {"rel_err": 0.0, "max_abs_err": 0.0, "tolerance": None}
        unread = {id(s): s for s in job.samples.get(case.label, [])}  # their descriptors, closed below
        for sample in samples if worst is None else []:
            unread.pop(id(sample), None)  # _verdict closes it
            v = _verdict(rt, case, sample, sample.name in inputs, digests.get(sample.name))
            for key in ("rel_err", "max_abs_err"):
                if getattr(v, key) is not None:
                    agg[key] = max(agg[key], getattr(v, key))
            agg["tolerance"] = v.tolerance or agg["tolerance"]
            if v.status is not Status.PASSED:
                worst = v
                break
        _close(unread.values())  # a judge that serves evaluation after evaluation keeps none open
        floors: dict = {"floor_us": None, "compute_floor_us": None}
        if rt.hooks is not None and (bandwidth or tflops) and samples:
            args, _ = _rebuild(rt, case, samples[0])
            moved, work = rt.hooks.bytes_moved(args), rt.hooks.flops(args)
            if bandwidth and moved is not None:
                floors.update(floor_us=moved / (bandwidth * 1e3), floor_kind=FloorKind.HOOK)
            if tflops and work is not None:
                floors["compute_floor_us"] = work / (tflops * 1e6)
        elif bandwidth and samples:
            args = _rebuild(rt, case, samples[0])[0]
            floors.update(floor_us=estimated_bytes(rt.config, args, rt.roles(args)) / (bandwidth * 1e3),
                          floor_kind=FloorKind.ESTIMATE)
        result = worst or Finding(status=Status.PASSED)
        if job.device is Device.CPU and result.status is Status.INCORRECT:
            result = blame_interpreter(result, job.source_fp8, _rebuild(rt, case, samples[0])[0],
                                       job.source_dot)
        # the failing sample's own errors, where it measured them, over the running maxima
        chan.send(Verdict(case=case.label, **{**agg, **result.model_dump(exclude_none=True)}, **floors))
    chan.send(Done())


def _close(samples) -> None:
    for sample in samples:
        if sample.fd is not None:
            try:
                os.close(sample.fd)
            except OSError:
                pass


def probe(job: Job, chan: Channel) -> None:
    """Load the package for real: every case's sizes, one case generated and baselined."""
    rt = TaskRuntime(job.task_dir, job.device)
    n = rt.num_cases()
    if n < 1:
        raise RuntimeError(f"{rt.task.config_path}: getNumOfTestcases() returned {n}")
    rows = []
    for index in range(1, n + 1):
        sizes, reps = rt.case_sizes(index)
        elems = sum(math.prod(s) for s in sizes if isinstance(s, (tuple, list)) and s)
        rows.append(ProbedCase(index=index, sizes=[list(s) for s in sizes if isinstance(s, (tuple, list)) and s],
                               warmup=reps[0], iters=reps[1], elements=elems))
    smallest = min(rows, key=lambda r: r.elements)
    case = CaseSpec(label=str(smallest.index), kind=CaseKind.CONTEST, index=smallest.index)
    args, _ = rt.make_args(case, None)
    outs = rt.outputs(args)
    run_baseline(rt.config, clone_args(args))
    extra = []
    for kind, params_list in (("smoke", rt.manifest.smoke if rt.manifest else []),
                              ("hidden", rt.manifest.hidden if rt.manifest else [])):
        for k, params in enumerate(params_list, 1):
            # every hook once, its answers checked against TaskHooks (one line naming the hooks file)
            a = rt.hooks.probe_case(f"{kind}-{k}", params, rt.device, outs)
            extra.append(ProbedExtra(label=f"{kind}-{k}", sizes=rt.describe(a), bytes=rt.hooks.bytes_moved(a)))
    chan.send(Probed(cases=rows, outputs=outs, inouts=list(rt.roles(args).inouts), baseline_label=rt.baseline_label, probed_case=smallest.index,
                     extra=extra))
    chan.send(Done())
