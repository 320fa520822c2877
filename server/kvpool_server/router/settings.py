"""RouterSettings: every option of kvpool-router, from flags or ``KVPOOL_ROUTER_*`` environment."""

from __future__ import annotations

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import SettingsConfigDict

from kvpool_server.flags import AdminTokenOptions


class RouterSettings(AdminTokenOptions):
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
        return self

    def upstreams(self) -> dict[str, str]:
        """Model name -> base URL, in the order given."""
        return {name: url.rstrip("/") for name, _, url in (u.partition("=") for u in self.upstream)}
