"""The `servetune` command. Sub-commands live in their own modules and import
their heavy dependencies lazily, so `servetune --help` stays fast."""

from __future__ import annotations

import sys

import typer

from servetune import __version__
from servetune.errors import InputError

app = typer.Typer(
    name="servetune",
    help="Plan, load-test, simulate and tune LLM serving engines, with evidence.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"servetune {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print the version."
    ),
) -> None:
    """servetune: model + hardware + SLO -> a proven, recorded serving config."""


def _register() -> None:
    from servetune.cli import catalog_cmd, plan_cmd

    plan_cmd.register(app)
    catalog_cmd.register(app)
    __import__("servetune.cli.engine_cmd", fromlist=["register"]).register(app)
    __import__("servetune.cli.bench_cmd", fromlist=["register"]).register(app)
    __import__("servetune.cli.sim_cmd", fromlist=["register"]).register(app)
    __import__("servetune.cli.runs_cmd", fromlist=["register"]).register(app)
    __import__("servetune.cli.report_cmd", fromlist=["register"]).register(app)
    __import__("servetune.cli.tune_cmd", fromlist=["register"]).register(app)
    __import__("servetune.cli.validate_cmd", fromlist=["register"]).register(app)
    __import__("servetune.cli.accept_cmd", fromlist=["register"]).register(app)
    __import__("servetune.cli.diagnose_cmd", fromlist=["register"]).register(app)
    __import__("servetune.cli.monitor_cmd", fromlist=["register"]).register(app)
    __import__("servetune.cli.quality_cmd", fromlist=["register"]).register(app)


_register()


def main() -> None:
    """Entry point: user errors become one line on stderr and exit code 2."""
    import signal

    # A process started in the background by a non-interactive shell (`cmd &` in a script,
    # CI) inherits SIGINT ignored, and Python then never raises KeyboardInterrupt: a
    # `kill -INT` to stop a bench or an engine would do nothing. Ctrl-C must always stop
    # a run and keep what it measured, so take SIGINT back.
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        # Without standalone mode click returns typer.Exit's code instead of exiting.
        code = app(standalone_mode=False)
        if isinstance(code, int) and code:
            sys.exit(code)
    except InputError as exc:
        print(f"error: {exc.one_line()}", file=sys.stderr)
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        sys.exit(130)
    except Exception as exc:
        # typer vendors click; its exceptions carry format_message() and exit_code.
        fmt, code = getattr(exc, "format_message", None), getattr(exc, "exit_code", None)
        if type(exc).__name__ == "NoArgsIsHelpError":
            print(exc.ctx.get_help())  # type: ignore[attr-defined]
            sys.exit(0)
        if callable(fmt) and isinstance(code, int):
            message = " ".join(str(fmt()).split())
            param = getattr(exc, "param", None)
            hint = getattr(param, "opts", None)
            prefix = f"{hint[0]}: " if hint and hint[0] not in message else ""
            print(f"error: {prefix}{message}", file=sys.stderr)
            sys.exit(2)
        if type(exc).__name__ in ("Exit", "Abort"):
            sys.exit(getattr(exc, "exit_code", 1))
        raise


if __name__ == "__main__":
    main()
