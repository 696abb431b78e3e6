"""Errors a client can cause, in the OpenAI error shape `{"error": {message, type, param, code}}`,
and the Anthropic shape for its paths; the gateway and the picker send them alike."""

from __future__ import annotations


class APIError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: dict | None = None,
    ):
        message, param = _printable(message), _printable(param)
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = (
            status,
            message,
            type,
            param,
            code,
        )
        self.headers = headers or {}

    def body(self) -> dict:
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }


def _printable(text: str | None) -> str | None:
    """Client text quoted in an error (a field name, a model id) with anything that cannot be
    encoded as UTF-8 (a lone surrogate) escaped, so the error itself can always be sent."""
    return (
        text
        if text is None or text.isascii()
        else text.encode("utf-8", "backslashreplace").decode("utf-8")
    )


def _param(loc: tuple) -> str | None:
    parts = [str(p) for p in loc if p != "body"]
    return ".".join(parts) or None


def validation_error(errors: list) -> APIError:
    """The first of pydantic's validation `errors` (a body its model refuses) as a 400."""
    first = errors[0]
    if first["type"] == "json_invalid":
        return APIError(400, json_problem(first.get("ctx", {}).get("error", first["msg"])))
    param = _param(tuple(first["loc"]))
    msg = first["msg"].removeprefix("Value error, ")
    if first["type"] == "missing":
        msg = f"missing required parameter: {param!r}"
    elif param:
        msg = f"invalid parameter {param!r}: {msg}"
    return APIError(
        400,
        msg,
        param=param,
        code="invalid_value" if first["type"] != "missing" else "missing_parameter",
    )


MAX_JSON_DEPTH = 200
"""Deepest nesting of JSON the gateway takes: the bound of pydantic's JSON parser, which decodes
every request body and every JSON text inside one."""

_JSON_PROBLEMS = (
    ("invalid unicode code point", "is not valid UTF-8"),
    ("surrogate", "is not valid Unicode: a \\u escape is a lone surrogate"),
    ("hex escape", "is not valid Unicode: a \\u escape is a lone surrogate or incomplete"),
    ("recursion limit", f"is nested more than {MAX_JSON_DEPTH} levels deep"),
)


def json_problem(error: str, what: str = "request body") -> str:
    """The strict JSON parser's `error` said plainly: what is wrong with `what`, and where."""
    for marker, problem in _JSON_PROBLEMS:
        if marker in error:
            where = error[error.find(" at line ") :] if " at line " in error else ""
            return f"{what} {problem}{where}"
    return f"{what} is not valid JSON: {error}"


ANTHROPIC_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
}


def anthropic_error_body(status: int, message: str) -> dict:
    return {
        "type": "error",
        "error": {"type": ANTHROPIC_ERROR_TYPES.get(status, "api_error"), "message": message},
    }


def error_body(path: str, err: APIError) -> dict:
    """`err`'s body in the error shape of the API that `path` belongs to."""
    if path.startswith("/v1/messages"):  # Anthropic clients expect their own error shape
        return anthropic_error_body(err.status, err.message)
    return err.body()
