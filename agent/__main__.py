"""The program: the CLI's commands and the MCP adapter's `mcp` command on one parser.

The top floor: the two adapters (cli/ and outside/) meet only here. `optagent` (the console script) and
`python -m optagent` start here; `python -m optagent.cli.main` has every command but `mcp`.
"""

from __future__ import annotations

import sys
from typing import Optional

from optagent.cli.main import main as cli_main
from optagent.outside.command import add_mcp_command


def main(argv: Optional[list[str]] = None) -> int:
    return cli_main(argv, extra=(add_mcp_command,))


if __name__ == "__main__":
    sys.exit(main())
