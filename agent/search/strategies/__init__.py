"""Library of proven kernel strategies, one folder per task family.

Each ``<family>/strategy.toml`` (schema: ``optagent.search.strategy_spec``; a task
package's own ``strategies/`` folder has the same layout) names the family, the
``run_kernel`` parameter list its kernels implement, and one ``[[strategy]]`` table
per kernel file (name, file, language, idea; ``gpu_checked = false`` keeps a kernel whose last
change has not yet run on a GPU out of runs, not out of its tests). A run tries them in
the order listed, so each family lists its kernels fastest first (as measured on the
H200): a later one must then beat it by more than the noise to replace it. Every kernel file is a complete contest
submission whose tunables are declared as knobs (``NAME = 4  # knob: 2, 4, 8``
in Python, ``#define NAME 4  // knob: 2, 4, 8`` in CUDA; the assigned value is the
default) so the offline planner can start from them and search their settings.
"""
