"""Command-line interface: a thin typer layer over the library."""
