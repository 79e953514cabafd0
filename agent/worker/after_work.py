"""The harness's work between two timed calls, the same for a candidate's loops and the baseline's.

After every timed call the timer calls ``AfterWork`` (outside the timed window): it keeps that
call's outputs if the judge may check them, poisons the outputs, puts back the in/out tensors'
contents (worker/arg_roles.py) and redraws the inputs, so no call reuses an answer. The native timer times this interval too (GPU work included). The
baseline's loop runs the same work, before any candidate code exists in the process (or in the
baseline job), so its interval is the reference the parent holds a candidate's against: a
candidate that rebinds the harness's helpers to do part of its work here is seen by that
comparison (evaluation/timer_check.py), not by anything in this file, which it can rewrite.

A re-time's loops run all of it too, though no judge follows: the work between calls slows the next call's launch
(add_rmsnorm's calls read 15% faster without it in the harness's loop on an H100: docs/gpu.md, 2026-12-07), so
a loop without it reads faster by itself, and a re-time is held to the judged figure (search/accept.py judged_floor).
"""

from __future__ import annotations

from typing import Optional

import torch

from optagent.worker import referee_client
from optagent.worker.digests import outputs_digest
from optagent.worker.harness import float_bases, poison, refresh_floats


class AfterWork:
    def __init__(self, sets: list[list], outs: list[int], inouts: tuple[int, ...] = ()):
        self.sets, self.poisoned, self.inouts = sets, list(outs), list(inouts)
        self.outs = sorted(self.poisoned + self.inouts)  # what each call's outputs are, saved for the judge
        self.scales = [float_bases(a, set(self.outs)) for a in sets]  # the base inputs, as the judge rebuilds them
        self.contents = [{j: a[j].clone() for j in self.inouts} for a in sets]  # each set's in/out tensors as made
        self.held: dict[int, dict] = {}  # call -> outputs, of calls the timer may ask for
        self.latest: dict[int, tuple[int, dict]] = {}  # set -> (call, outputs) of its latest call
        # under a referee (evaluation/referee.py) it draws the seeds and chooses the kept calls, not the timer
        self.refereed = referee_client.active()
        self.seeds: list[Optional[int]] = [None] * len(sets)  # the seed each set's inputs were redrawn with
        self.kept: dict[int, tuple[int, Optional[int]]] = {}  # call -> (set, seed of its inputs): the referee's
        self._calls = 0  # timed calls in this loop (the referee numbers them from 0)

    def begin_loop(self) -> None:
        self._calls = 0
        self.kept.clear()

    def __call__(self, call: int, k: int, seed: int, keep: bool, drop: int) -> None:
        args = self.sets[k]
        if self.refereed:
            call, seed, keep, drop = self._ask(call, k)
        if call >= 0:
            out = {j: args[j].detach().clone() for j in self.outs}  # on the device: cheap; to host when saved
            self.latest[k] = (call, out)
            if keep:
                self.held[call] = out
            self.held.pop(drop, None)
        self.poison_set(args)
        self.put_back(k)
        refresh_floats(args, seed, self.scales[k])

    def put_back(self, k: int) -> None:
        """Set k's in/out tensors as they were made (an in-place kernel's next call starts where its first did)."""
        for j, made in self.contents[k].items():
            self.sets[k][j].copy_(made)

    def _ask(self, call: int, k: int) -> tuple[int, int, bool, int]:
        """The referee's seed and keep for this call, after its outputs' digest is told (a warm-up: the seed)."""
        if call < 0:
            _, seed, _, _ = referee_client.ask(f"W {k}")
            self.seeds[k] = int(seed)
            return call, int(seed), False, -1
        call, self._calls = self._calls, self._calls + 1
        outs = {j: self.sets[k][j] for j in self.outs}
        _, seed, keep, drop = referee_client.ask(f"R {call} {k} {outputs_digest(outs)}")
        if keep == "1":
            self.kept[call] = (k, self.seeds[k])
        self.kept.pop(int(drop), None)
        self.seeds[k] = int(seed)
        return call, int(seed), keep == "1", int(drop)

    def poison_set(self, args: list) -> None:
        for j in self.poisoned:
            poison(args[j])

    def poison_all(self) -> None:
        """Every set as before its first timed call: outputs poisoned, in/out tensors put back. Called
        after a warm-up that ran outside the after-work (the CUDA graphs' capture): an in-place kernel's
        warm-up call has already changed them, and a replay on that state answers another question."""
        for k, args in enumerate(self.sets):
            self.poison_set(args)
            self.put_back(k)

    def take(self, call: int, k: int) -> Optional[dict]:
        """The outputs the timer kept for `call` on set k, if the harness still holds them."""
        if call in self.held:
            return self.held[call]
        latest = self.latest.get(k)
        return latest[1] if latest is not None and latest[0] == call else None

    def clear(self) -> None:
        self.held.clear()
        self.latest.clear()


def out_bytes(sets: list[list], outs: list[int]) -> int:
    first = sets[0]
    return sum(first[j].numel() * first[j].element_size() for j in outs if isinstance(first[j], torch.Tensor))
