"""The application floor: the one place that assembles and drives a run (build, runs, evaluate) and what an
outside agent may do with one (operations, steps). The CLI (cli/) and the MCP server (outside/) are thin
adapters over it and never import each other."""
