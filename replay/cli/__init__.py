"""The ``kvtrace`` command line: one entry point, subcommands registered from their modules.

One top-level handler (``_Kvtrace.invoke``) turns the layers' exceptions into one-line messages:
``kvtrace: error: <message>`` on stderr with exit status 2 (refused, bad input; click's own
errors and usage errors too, after the usage line) or 1 (data lost, a failed check), 128+N for a
signal; any other exception prints its type and message plus "run `kvtrace --debug ...` for the
traceback" and exits 3. ``kvtrace --debug CMD`` re-raises instead. A message naming an unknown
value and the known ones ("unknown knob 'page_sise'; valid knobs: ...") gets a "did you mean"
(:func:`replay.cli.text.suggest`). A closed pipe (``kvtrace verify T | head -1``) ends quietly
with status 141 (128 + SIGPIPE), like other tools.
"""

from __future__ import annotations

import importlib
import os
import sys

import click

from replay.errors import EXIT_INTERNAL, EXIT_REFUSED, Interrupted, KvtraceError, signal_of

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
    ("replay.cli.plan", "plan_cmd"),
    ("replay.cli.capacity", "capacity_cmd"),
    ("replay.cli.compare", "compare_cmd"),
    ("replay.cli.diff", "diff_cmd"),
    ("replay.cli.compact", "compact_cmd"),
]


class _Kvtrace(click.Group):
    """The ``kvtrace`` group with the one top-level error handler."""

    def invoke(self, ctx: click.Context):
        try:
            rv = super().invoke(ctx)
            sys.stdout.flush()  # a closed pipe shows here, inside the handler, not at exit
            return rv
        except (click.exceptions.Exit, click.exceptions.Abort):
            raise
        except SystemExit:
            with _quiet_pipe():
                sys.stdout.flush()
            raise
        except click.exceptions.UsageError as e:
            if e.ctx is not None:
                click.echo(e.ctx.get_usage(), err=True)
                click.echo(f"Try '{e.ctx.command_path} -h' for help.\n", err=True)
            click.echo(f"kvtrace: error: {e.format_message()}", err=True)
            ctx.exit(EXIT_REFUSED)
        except click.exceptions.ClickException as e:
            click.echo(f"kvtrace: error: {e.format_message()}", err=True)
            ctx.exit(EXIT_REFUSED)
        except BrokenPipeError:
            _silence_stdout()
            ctx.exit(EXIT_PIPE)
        except BaseException as e:  # noqa: BLE001
            if ctx.params.get("debug"):
                raise
            code, message = _describe(e)
            with _quiet_pipe():
                click.echo(f"kvtrace: error: {message}", err=True)
            ctx.exit(code)


EXIT_PIPE = 141  # 128 + SIGPIPE: the reader closed the pipe


def _silence_stdout() -> None:
    """After EPIPE: point stdout at /dev/null so the interpreter's final flush stays quiet."""
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, fd)
    os.close(devnull)


class _quiet_pipe:
    """Swallow a BrokenPipeError (and silence stdout) in the block."""

    def __enter__(self):
        return self

    def __exit__(self, typ, e, tb):
        if typ is not None and issubclass(typ, BrokenPipeError):
            _silence_stdout()
            return True
        return False


def _describe(e: BaseException) -> tuple[int, str]:
    """(exit status, one-line message) for an exception that reached the top."""
    from tracer.schema import SchemaError

    from replay.cli.text import suggest

    if isinstance(e, KvtraceError):
        return e.exit_code, suggest(str(e))
    if isinstance(e, KeyboardInterrupt):
        sig = signal_of(e)
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
                           + " (run `kvtrace --debug ...` for the traceback)")


@click.group(cls=_Kvtrace, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(package_name="kvtrace")
@click.option("--debug", is_flag=True, help="Show the Python traceback of an error instead of a one-line message.")
def main(debug: bool) -> None:
    """kvtrace: record, replay and analyze KV-cache memory of SGLang-family servers.

    Exit status: 0 done; 1 something was lost, a check failed, or verify/doctor found a leak or
    growth; 2 refused (bad input, nothing changed); 3 internal error; 128+N stopped by signal N
    (141: the reader closed the pipe).
    """


for _mod, _attr in _SUBCOMMANDS:
    main.add_command(getattr(importlib.import_module(_mod), _attr))


if __name__ == "__main__":
    main()
