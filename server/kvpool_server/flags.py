"""Settings from flags and environment, with errors that name the flag and its variable -- for
every command of the server package (kvpool-server, kvpool-router)."""

from __future__ import annotations

import sys
from typing import TypeVar

from pydantic import ValidationError
from pydantic_settings import BaseSettings, CliApp

S = TypeVar("S", bound=BaseSettings)


def parse_flags(cls: type[S], argv: list[str]) -> S:
    """``cls`` from ``argv`` and its environment; a bad value exits naming the option."""
    prog = cls.model_config.get("cli_prog_name") or cls.__name__
    prefix = cls.model_config.get("env_prefix", "")
    try:
        return CliApp.run(cls, cli_args=argv)
    except ValidationError as e:
        lines = []
        for err in e.errors():
            message = err["msg"].removeprefix("Value error, ")
            if not err["loc"]:  # a check across options: its message names them
                lines.append(message)
                continue
            field = str(err["loc"][0])
            lines.append(f"--{field.replace('_', '-')} (env {prefix}{field.upper()}): {message}")
        sys.exit(f"{prog}: error: " + "; ".join(lines))
