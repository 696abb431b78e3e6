"""The gateway's answers to errors: `calls.errors`' shapes as FastAPI responses, and the
handlers that turn FastAPI's and Starlette's exceptions into them."""

from __future__ import annotations

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from talariad.calls.errors import APIError, error_body, validation_error


def error_response(path: str, err: APIError) -> JSONResponse:
    """`err` in the error shape of the API that `path` belongs to."""
    return JSONResponse(error_body(path, err), status_code=err.status, headers=err.headers)


def _response(request: Request, err: APIError) -> JSONResponse:
    return error_response(request.url.path, err)


def install(app) -> None:
    @app.exception_handler(APIError)
    async def _api(request: Request, exc: APIError) -> JSONResponse:
        return _response(request, exc)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        return _response(request, validation_error(exc.errors()))

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        return _response(request, APIError(exc.status_code, str(exc.detail), type=kind))
