"""The ``kvtrace`` command line: one entry point, subcommands registered from their modules.

One top-level handler (``_Kvtrace.invoke``) turns the layers' exceptions into one-line messages:
``kvtrace: error: <message>`` on stderr with exit status 2 (refused, bad input) or 1 (data lost,
a failed check), 128+N for a signal; any other exception prints its type and message plus
"run with --debug for the traceback" and exits 3. ``kvtrace --debug CMD`` re-raises instead.
"""

from __future__ import annotations

import importlib
import sys

import click

from replay.errors import EXIT_INTERNAL, EXIT_REFUSED, Interrupted, KvtraceError

# (module, attribute) of each click command/group added to ``kvtrace``. Each owner adds its line.
_SUBCOMMANDS: list[tuple[str, str]] = [
    ("replay.cli.inspect", "inspect"),
    ("replay.cli.recover", "recover_cmd"),
    ("replay.cli.workload", "workload"),
    ("replay.cli.record", "record"),
    ("replay.cli.launch", "launch"),
    ("replay.cli.launch", "hooks"),
    ("replay.cli.export", "export"),
    ("replay.cli.report", "report"),
    ("replay.cli.lab", "lab"),
    ("replay.cli.verify", "verify"),
    ("replay.cli.doctor", "doctor"),
    ("replay.cli.policies", "policies"),
    ("replay.cli.replay", "replay_cmd"),
    ("replay.cli.sweep", "sweep_cmd"),
    ("replay.cli.compare", "compare_cmd"),
    ("replay.cli.diff", "diff_cmd"),
    ("replay.cli.compact", "compact_cmd"),
]


class _Kvtrace(click.Group):
    """The ``kvtrace`` group with the one top-level error handler."""

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except (click.exceptions.ClickException, click.exceptions.Exit, click.exceptions.Abort):
            raise
        except BaseException as e:  # noqa: BLE001  (SystemExit passes through below)
            if isinstance(e, SystemExit) or ctx.params.get("debug"):
                raise
            code, message = _describe(e)
            click.echo(f"kvtrace: error: {message}", err=True)
            ctx.exit(code)


def _describe(e: BaseException) -> tuple[int, str]:
    """(exit status, one-line message) for an exception that reached the top."""
    from tracer.schema import SchemaError

    if isinstance(e, KvtraceError):
        return e.exit_code, str(e)
    if isinstance(e, KeyboardInterrupt):
        sig = e.args[0] if e.args and str(e.args[0]).startswith("SIG") else "SIGINT"
        return Interrupted(sig).exit_code, f"interrupted by {sig}"
    if isinstance(e, SchemaError):
        return EXIT_REFUSED, str(e)
    if isinstance(e, OSError):  # disk full, permission, not a directory, missing file, ...
        if not e.strerror:
            return EXIT_REFUSED, str(e)
        where = f"{e.filename}: " if e.filename else ""
        return EXIT_REFUSED, f"{where}{e.strerror}"
    text = str(e).splitlines()[0] if str(e) else ""
    return EXIT_INTERNAL, (f"unexpected {type(e).__name__}" + (f": {text}" if text else "")
                           + " (run with --debug for the traceback)")


@click.group(cls=_Kvtrace, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(package_name="kvtrace")
@click.option("--debug", is_flag=True, help="Show the Python traceback of an error instead of a one-line message.")
def main(debug: bool) -> None:
    """kvtrace: record, replay and analyze KV-cache memory of SGLang-family servers.

    Exit status: 0 done; 1 something was lost or a check failed; 2 refused (bad input, nothing
    changed); 3 internal error; 128+N stopped by signal N.
    """


for _mod, _attr in _SUBCOMMANDS:
    main.add_command(getattr(importlib.import_module(_mod), _attr))


if __name__ == "__main__":
    main()
