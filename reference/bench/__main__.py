"""`python -m reference.bench COMMAND [options]`: see reference/bench/__init__.py for the list."""
from __future__ import annotations

import importlib
import sys

from reference.bench import __doc__ as PACKAGE_DOC

# command -> module of reference.bench whose main(argv) runs it
COMMANDS = {"decode": "decode", "passes": "passes", "batch": "batch", "serve": "serve",
            "speculative": "speculative", "engine-host": "host", "kernels": "kernels",
            "threads": "threads"}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] not in COMMANDS:
        usage = "\n".join(line for line in PACKAGE_DOC.splitlines() if "python -m reference.bench" in line)
        print(f"usage: python -m reference.bench {{{','.join(COMMANDS)}}} [options]\n{usage}",
              file=sys.stderr)
        return 0 if argv[:1] in (["-h"], ["--help"]) else 2
    importlib.import_module(f"reference.bench.{COMMANDS[argv[0]]}").main(argv[1:])
    return 0


if __name__ == "__main__":
    sys.exit(main())
