"""The `cmt` command line. Each subcommand lives in its own module; this file only wires them."""

from __future__ import annotations

import importlib
import sys

import click

from . import __version__, launcher
from . import config as cfg
from .errors import CmtError
from .options import config_option, takes_command

# The other subcommands, each imported only when named (or listed by --help): `cmt run` must start
# fast and must not load numpy, rich's tables or matplotlib, which they use.
_SUBCOMMANDS = {"bench": "cmt.bench.cli", "config": "cmt.tune.config_cli", "doctor": "cmt.doctor.cli",
                "profile": "cmt.profile.cli", "tune": "cmt.tune.cli"}


class CmtGroup(click.Group):
    """Loads the subcommands lazily, and turns CmtError into `cmt: message` and its exit code: bad
    input never shows a traceback."""

    def list_commands(self, ctx):
        return sorted({*super().list_commands(ctx), *_SUBCOMMANDS})

    def get_command(self, ctx, name):
        if name in _SUBCOMMANDS and name not in self.commands:
            self.add_command(getattr(importlib.import_module(_SUBCOMMANDS[name]), name))
        return super().get_command(ctx, name)

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


@takes_command(required=True)
@config_option()
def run(config_path, command):
    """Run CMD with cmt's copy acceleration: cmt run -- python train.py"""
    selection = cfg.select(config_path)
    launcher.exec_command(command, launcher.preload_env(selection))


main.add_command(run)

if __name__ == "__main__":
    main()
