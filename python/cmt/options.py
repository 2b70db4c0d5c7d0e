"""Command-line pieces shared by `cmt run`, `cmt tune` and `cmt profile`: the trailing command and
the --config option (with the order in which cmt.config.select chooses a tuned file)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

CONFIG_ORDER = ("else CMT_CONFIG, else the tuned file `cmt tune` wrote for this machine, else a profile shipped "
                "for this machine, else the built-in defaults")


def config_option(what: str = "Tuned file to use") -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """--config FILE, passed as `config_path`; its help names the whole order of cmt.config.select."""
    return click.option("--config", "config_path", metavar="FILE", help=f"{what} ({CONFIG_ORDER}).")


def takes_command(required: bool = False) -> Callable[[Callable[..., Any]], click.Command]:
    """`@click.command` for `cmt X [OPTIONS] [--] CMD [ARGS]...`, CMD given as `command` (a tuple).

    Options are parsed up to `--` or the first word that does not start with '-'; that word and
    everything after it is CMD, untouched (`cmt run python -u x.py`). An unknown option before it is
    a usage error naming the closest option (exit 2), never taken for the command: click's
    `ignore_unknown_options` would turn `--serach` into CMD and end in "command not found"."""

    def wrap(f: Callable[..., Any]) -> click.Command:
        metavar = "-- CMD [ARGS]..." if required else "[-- CMD [ARGS]...]"
        f = click.argument("command", nargs=-1, required=required, type=click.UNPROCESSED, metavar=metavar)(f)
        return click.command(context_settings={"allow_interspersed_args": False})(f)

    return wrap
