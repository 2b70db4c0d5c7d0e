"""The `cmt` command line. Each subcommand lives in its own module; this file only wires them."""

from __future__ import annotations

import sys

import click

from . import __version__, launcher
from . import config as cfg
from .errors import CmtError


class CmtGroup(click.Group):
    """Turns CmtError into `cmt: message` and its exit code: bad input never shows a traceback."""

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except CmtError as e:
            click.echo(f"cmt: {e}", err=True)
            sys.exit(e.exit_code)


@click.group(cls=CmtGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="cmt")
def main():
    """cmt (cudamemcpy-tuner): pageable host<->GPU copies at the PCIe link's speed."""


@main.command(context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.option("--config", "config_path", metavar="FILE", help="Tuned file to use (else CMT_CONFIG, else defaults).")
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
def run(config_path, command):
    """Run COMMAND with cmt's copy acceleration: cmt run -- python train.py"""
    selection = cfg.select(config_path)
    launcher.exec_command(command, launcher.preload_env(selection))


def _register_optional_commands() -> None:
    """Subcommands that live in their own packages (bench, tune, config, profile)."""
    import importlib

    for module, name in (("cmt.bench.cli", "bench"), ("cmt.tune.cli", "tune"),
                         ("cmt.tune.config_cli", "config"), ("cmt.profile.cli", "profile")):
        try:
            mod = importlib.import_module(module)
        except ModuleNotFoundError as e:
            if e.name and module.startswith(e.name):
                continue  # not built yet
            raise
        main.add_command(getattr(mod, name))


_register_optional_commands()

if __name__ == "__main__":
    main()
