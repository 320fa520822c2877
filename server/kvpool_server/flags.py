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


class AdminToken:
    """The admin token now: fixed (a flag, the environment), or read from a file and read again
    whenever the file changes -- a rotated Secret reaches a running server without a restart (the
    kubelet swaps a mounted Secret's files atomically; one ``stat`` a request notices it).

    An empty or unreadable file at run time keeps the last token: a half-written file must not
    switch authentication off."""

    def __init__(self, fixed: str | None = None, path: Path | None = None) -> None:
        self.path, self._value = path, fixed
        self._seen: tuple[int, int, int] | None = None
        if path is not None and self.current() is None:
            raise ValueError(f"admin-token-file {path} is empty: write the token into it")

    def current(self) -> str | None:
        if self.path is None:
            return self._value
        try:
            st = self.path.stat()
            seen = (st.st_ino, st.st_mtime_ns, st.st_size)
            if seen != self._seen:
                self._value, self._seen = self.path.read_text().strip() or self._value, seen
        except OSError:
            pass  # mid-swap or gone: keep the last token
        return self._value


class AdminTokenOptions(BaseSettings):
    """The admin token: a flag, ``KVPOOL_ADMIN_TOKEN`` (the chart's Secret), or a mounted file."""

    admin_token: SecretStr | None = Field(
        None,
        validation_alias=AliasChoices("admin_token", "KVPOOL_ADMIN_TOKEN"),
        description="bearer token the /kvpool admin routes require (or set admin-token-file)",
    )
    admin_token_file: Path | None = Field(
        None, description="file holding the admin token (a mounted Secret); read again when it changes"
    )

    @field_validator("admin_token_file")
    @classmethod
    def _token_file_exists(cls, value: Path | None) -> Path | None:
        if value is not None and not value.is_file():
            raise ValueError(f"admin-token-file {value} does not exist")
        if value is not None and not value.read_text().strip():
            raise ValueError(f"admin-token-file {value} is empty: write the token into it")
        return value

    def admin_token_source(self) -> AdminToken:
        if self.admin_token_file is not None:
            return AdminToken(path=self.admin_token_file)
        return AdminToken(self.admin_token.get_secret_value() if self.admin_token else None)
