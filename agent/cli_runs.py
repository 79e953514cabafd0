"""Run commands: run, resume, runs, show, leaderboard, report."""

from __future__ import annotations

import argparse


def add_run_commands(sub: argparse._SubParsersAction) -> None:
    return None
