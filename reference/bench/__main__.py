"""`python -m reference.bench COMMAND [options] [--save]`: see reference/bench/__init__.py for the
list. `--save` also writes what the command printed, under its provenance (date, command line,
CPU, versions), into the command's section of the results page, `results/README.md`."""
from __future__ import annotations

import contextlib
import importlib
import io
import re
import sys
from pathlib import Path

from reference.bench import __doc__ as PACKAGE_DOC

# command -> module of reference.bench whose main(argv) runs it
COMMANDS = {"decode": "decode", "passes": "passes", "batch": "batch", "serve": "serve",
            "speculative": "speculative", "engine-host": "host", "kernels": "kernels",
            "threads": "threads"}
RESULTS = Path(__file__).parent / "results" / "README.md"
NEW_SECTIONS = "<!-- new sections go above this line -->"


class _Tee(io.TextIOBase):
    """Writes to the terminal and keeps a copy."""

    def __init__(self, terminal):
        self.terminal, self.kept = terminal, io.StringIO()

    def write(self, text: str) -> int:
        self.kept.write(text)
        return self.terminal.write(text)

    def flush(self) -> None:
        self.terminal.flush()


def save(command: str, argv: list[str], printed: str, page: Path = RESULTS) -> None:
    """Put `printed` (a run's output) under its provenance in `command`'s section of `page`,
    replacing the section's earlier run, or adding the section above `NEW_SECTIONS` (or at the
    end of a page without that line)."""
    from reference.bench.measure import provenance
    info = provenance(f"python -m reference.bench {command}", argv)
    where = " · ".join(f"{key} {info[key]}" for key in ("cpu", "cpus_allowed", "torch", "triton",
                                                       "python") if info.get(key) is not None)
    lines = [line.rstrip() for line in printed.splitlines() if "\r" not in line]  # no progress bars
    section = (f"<!-- bench {command} -->\n## `{command}`\n\n`{info['command']}`, {info['date']}  \n"
               f"{where.replace('cpus_allowed', 'cores allowed:')}\n\n```text\n"
               + "\n".join(lines).strip("\n") + f"\n```\n<!-- /bench {command} -->\n")
    text = page.read_text() if page.exists() else ""
    pattern = re.compile(rf"<!-- bench {re.escape(command)} -->\n.*?<!-- /bench {re.escape(command)} -->\n",
                         re.DOTALL)
    if pattern.search(text):
        text = pattern.sub(lambda _: section, text)
    elif NEW_SECTIONS in text:   # above the older runs kept at the end of the page
        text = text.replace(NEW_SECTIONS, section + "\n" + NEW_SECTIONS)
    else:
        text = text.rstrip("\n") + "\n\n" + section
    page.write_text(text)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] not in COMMANDS:
        usage = "\n".join(line for line in PACKAGE_DOC.splitlines() if "python -m reference.bench" in line)
        print(f"usage: python -m reference.bench {{{','.join(COMMANDS)}}} [options] [--save]\n{usage}",
              file=sys.stderr)
        return 0 if argv[:1] in (["-h"], ["--help"]) else 2
    command, options = argv[0], [a for a in argv[1:] if a != "--save"]
    run = importlib.import_module(f"reference.bench.{COMMANDS[command]}").main
    if "--save" not in argv[1:]:
        run(options)
        return 0
    tee = _Tee(sys.stdout)
    with contextlib.redirect_stdout(tee):
        run(options)
    save(command, options, tee.kept.getvalue())
    return 0


if __name__ == "__main__":
    sys.exit(main())
