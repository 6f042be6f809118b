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


_register()


def main() -> None:
    """Entry point: user errors become one line on stderr and exit code 2."""
    try:
        app(standalone_mode=False)
    except InputError as exc:
        print(f"error: {exc.one_line()}", file=sys.stderr)
        sys.exit(exc.exit_code)
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except typer.Abort:
        print("aborted", file=sys.stderr)
        sys.exit(130)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        sys.exit(130)
    except Exception as exc:  # click usage errors
        import click

        if isinstance(exc, click.exceptions.ClickException):
            print(f"error: {exc.format_message()}", file=sys.stderr)
            sys.exit(2)
        raise


if __name__ == "__main__":
    main()
