"""RouterSettings: every option of kvpool-router, from flags or ``KVPOOL_ROUTER_*`` environment."""

from __future__ import annotations

from pathlib import Path

from pydantic import AliasChoices, Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


class RouterSettings(BaseSettings):
    """kvpool-router: one OpenAI endpoint in front of a group's model servers."""

    model_config = SettingsConfigDict(
        env_prefix="KVPOOL_ROUTER_", extra="forbid", cli_kebab_case=True, cli_prog_name="kvpool-router"
    )

    upstream: list[str] = Field(
        default_factory=list, description="NAME=URL of one model server (repeat the flag per model)"
    )
    host: str = Field("127.0.0.1", description="address to listen on")
    port: int = Field(9000, ge=1, le=65535, description="HTTP port")
    api_key: SecretStr | None = Field(None, description="key the OpenAI routes require (as a server's --api-key)")
    admin_token: SecretStr | None = Field(
        None,
        validation_alias=AliasChoices("admin_token", "KVPOOL_ADMIN_TOKEN"),
        description="bearer token of GET /kvpool here, and of the servers' admin routes",
    )
    admin_token_file: Path | None = Field(None, description="file holding the admin token (a mounted Secret)")
    poll_s: float = Field(
        5.0, gt=0, description="seconds between readiness checks of each server (a refused connection counts at once)"
    )
    connect_timeout_s: float = Field(5.0, gt=0, description="seconds to connect to a server before 503")
    retry_after_s: int = Field(5, ge=1, description="Retry-After of a 503 for a model that is not ready")
    log_json: bool = Field(False, description="one JSON object per log line")

    @field_validator("upstream")
    @classmethod
    def _parse_upstreams(cls, value: list[str]) -> list[str]:
        names = []
        for item in value:
            name, sep, url = item.partition("=")
            if not sep or not name or not url.startswith(("http://", "https://")):
                raise ValueError(f"{item!r} is not NAME=http://HOST:PORT")
            names.append(name)
        if len(set(names)) != len(names):
            raise ValueError(f"model names repeat: {sorted(names)}")
        return value

    @model_validator(mode="after")
    def _check(self) -> RouterSettings:
        if not self.upstream:
            raise ValueError("name at least one model server: --upstream NAME=http://HOST:PORT")
        if self.admin_token_file is not None and not self.admin_token_file.is_file():
            raise ValueError(f"admin-token-file {self.admin_token_file} does not exist")
        return self

    def upstreams(self) -> dict[str, str]:
        """Model name -> base URL, in the order given."""
        return {name: url.rstrip("/") for name, _, url in (u.partition("=") for u in self.upstream)}

    def resolved_admin_token(self) -> str | None:
        if self.admin_token_file is not None:
            return self.admin_token_file.read_text().strip() or None
        return self.admin_token.get_secret_value() if self.admin_token else None
