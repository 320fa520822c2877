"""Errors in OpenAI's format (``{"error": {"message", "type", "param", "code"}}``, as vLLM and
OpenAI send them), so every OpenAI client raises its own typed error with our message."""

from __future__ import annotations

from fastapi.responses import JSONResponse

_TYPES = {
    400: "BadRequestError",
    401: "AuthenticationError",
    403: "PermissionDeniedError",
    404: "NotFoundError",
    502: "BadGatewayError",
    503: "ServiceUnavailableError",
}


class RouterError(Exception):
    """A request the router answers itself; ``param`` names the field to fix."""

    def __init__(self, status: int, message: str, param: str | None = None, retry_after_s: int | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.retry_after_s = status, message, param, retry_after_s

    def response(self) -> JSONResponse:
        body = {"error": {"message": self.message, "type": _TYPES.get(self.status, "Error"), "param": self.param,
                          "code": self.status}}  # fmt: skip
        headers = {"Retry-After": str(self.retry_after_s)} if self.retry_after_s else None
        return JSONResponse(body, status_code=self.status, headers=headers)
