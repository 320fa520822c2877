"""Settings from flags and environment, with errors that name the flag and its variable, and the
options every command of the server package shares (kvpool-server, kvpool-router). Light on
purpose: the router imports it and must not import the pool or vLLM."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TypeVar

from pydantic import AliasChoices, Field, SecretStr, ValidationError, field_validator
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


class AdminTokenOptions(BaseSettings):
    """The admin token: a flag, ``KVPOOL_ADMIN_TOKEN`` (the chart's Secret), or a mounted file."""

    admin_token: SecretStr | None = Field(
        None,
        validation_alias=AliasChoices("admin_token", "KVPOOL_ADMIN_TOKEN"),
        description="bearer token the /kvpool admin routes require (or set admin-token-file)",
    )
    admin_token_file: Path | None = Field(None, description="file holding the admin token (a mounted Secret)")

    @field_validator("admin_token_file")
    @classmethod
    def _token_file_exists(cls, value: Path | None) -> Path | None:
        if value is not None and not value.is_file():
            raise ValueError(f"admin-token-file {value} does not exist")
        return value

    def resolved_admin_token(self) -> str | None:
        if self.admin_token_file is not None:
            return self.admin_token_file.read_text().strip() or None
        return self.admin_token.get_secret_value() if self.admin_token else None
