"""Options several commands share, with their defaults read from where the defaults live
(the evaluator's timeout, the loop's Limits), so that a default is written once."""

from __future__ import annotations

import argparse
from typing import Optional

from optagent.cli.inputs import NON_NEGATIVE, PATIENCE, SECONDS, STEPS, WIDTH, number
from optagent.evaluation.evaluator import TIMEOUT_S
from optagent.schema import ClusterEngine, Device, Language, PlannerKind, RunConfig
from optagent.search.loop import Limits


REQUEST_TIMEOUT_S = RunConfig.model_fields["request_timeout_s"].default


def add_eval_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--device", choices=[d.value for d in Device], help="default: cuda when a GPU is visible, else cpu")
    p.add_argument("--cases", help="contest cases to run, e.g. 1,3-5 (default: all on GPU, smoke cases on CPU)")
    p.add_argument("--timeout", type=SECONDS, default=TIMEOUT_S,
                   help=f"seconds per candidate process (default {TIMEOUT_S:g})")
    p.add_argument("--language", choices=[x.value for x in Language], help="default: recognised from the source")
    p.add_argument("--compiler", help="CUDA compiler command template, e.g. "
                   "'nvcc -O3 -shared -Xcompiler -fPIC {arch} -o {out} {src}' (or OPTAGENT_NVCC)")
    p.add_argument("--no-hidden", action="store_true", help="skip the manifest's hidden integrity cases")
    p.add_argument("--isolation", choices=["auto", "bwrap", "landlock", "unshare", "none"],
                   help="the sandbox (default auto: bwrap, else Landlock, else refuse); unshare (a writable file "
                        "system) and none run candidate kernels only when named (or OPTAGENT_ISOLATION)")
    add_profile_option(p)


def add_profile_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--profile", action="store_true", help="profile each passing kernel once per case under Nsight "
                   "Compute (ncu, or OPTAGENT_NCU), in the sandbox: DRAM and SM throughput, stalls, into the prompt "
                   "and show")


def add_planner_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--planner", choices=[k.value for k in PlannerKind], default=PlannerKind.AUTO.value,
                   help="auto: llm when an endpoint is configured, else offline")
    p.add_argument("--replay", metavar="FILE", help="recorded replies for --planner replay")
    p.add_argument("--base-url", help="OpenAI-compatible endpoint (or OPTAGENT_BASE_URL)")
    p.add_argument("--model", help="model name (or OPTAGENT_MODEL); key from OPTAGENT_API_KEY or OPENAI_API_KEY")
    p.add_argument("--request-timeout", type=SECONDS, default=REQUEST_TIMEOUT_S, metavar="S",
                   help=f"seconds to wait for one LLM reply (default {REQUEST_TIMEOUT_S:g}; reasoning models are slow)")
    p.add_argument("--max-tokens", type=number("a whole number of tokens >= 1", integer=True, minimum=1),
                   help="most tokens of one LLM reply (default: the server's)")
    p.add_argument("--temperature", type=NON_NEGATIVE, help="LLM sampling temperature (default: the server's)")


def add_limit_options(p: argparse.ArgumentParser) -> None:
    d = Limits()
    p.add_argument("--min-gain", type=NON_NEGATIVE, default=d.min_gain,
                   help=f"smallest geomean gain that counts (default {d.min_gain:g})")
    p.add_argument("--patience", type=PATIENCE, default=d.patience,
                   help=f"stop after this many steps without gain (default {d.patience})")
    p.add_argument("--max-steps", type=STEPS, default=d.max_steps,
                   help=f"at most this many candidates after the starter; 0 evaluates the starter only "
                        f"(default {d.max_steps})")
    p.add_argument("--width", type=WIDTH, default=d.width,
                   help=f"candidates proposed and evaluated per round, each from a parent chosen among the best "
                        f"passing kernels; --max-steps still counts candidates (default {d.width})")
    p.add_argument("--time-limit", type=SECONDS, default=d.time_limit_s, help="stop after this many seconds")
    p.add_argument("--budget-usd", type=NON_NEGATIVE, default=d.budget_usd,
                   help="stop once LLM spending reaches this")


def cluster_option(text: str) -> tuple[ClusterEngine, Optional[str]]:
    """--cluster local | ray | ray=ADDRESS -> (engine, address)."""
    name, sep, address = text.partition("=")
    try:
        engine = ClusterEngine(name.strip().lower())
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be local, ray or ray=ADDRESS, got {text}") from None
    if sep and (engine is ClusterEngine.LOCAL or not address.strip()):
        raise argparse.ArgumentTypeError(f"must be local, ray or ray=ADDRESS (an address after ray=), got {text}")
    return engine, address.strip() or None


def add_pool_options(p: argparse.ArgumentParser, resume: bool = False) -> None:
    p.add_argument("--jobs", type=number("a whole number of evaluations >= 1", integer=True, minimum=1),
                   help="evaluations at once (default: two per timing lane plus two, at most half the cores; "
                        "with --cluster ray, on each lane actor); timing stays one at a time per GPU")
    p.add_argument("--cluster", type=cluster_option, metavar="ray[=ADDRESS]",
                   help="evaluate on a Ray cluster: a lane actor per GPU on any node (ADDRESS: the head's "
                        "HOST:PORT or auto; without it a local Ray instance); pip install 'optagent[cluster]'. "
                        + ("Default: the run's own; local goes back to this host's pool" if resume
                           else "Default: local, this host's pool"))


def add_runs_dir(p: argparse.ArgumentParser) -> None:
    p.add_argument("--runs-dir", help="where runs live (default ./runs or OPTAGENT_RUNS_DIR)")
