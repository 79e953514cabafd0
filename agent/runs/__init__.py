"""The run on disk and in memory: runs/<id>/ (store, files), the task ledger across runs (ledger, memory),
the run read once (trajectory), its tree of steps (tree), and what a planner may see of it (view)."""
