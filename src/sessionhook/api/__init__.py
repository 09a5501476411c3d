"""Typed async client of the Sessions API (``/v1alpha``): models, client, errors."""

from .client import RetryPolicy, SessionsClient
from .errors import (
    ApiError,
    ApiStatusError,
    InvalidArgumentError,
    MalformedResponseError,
    NotFoundError,
    PermissionDeniedError,
    RateLimitedError,
    ServerError,
    TransportError,
    UnauthenticatedError,
)
from .models import (
    Activity,
    Artifact,
    Plan,
    PlanStep,
    Session,
    SessionState,
    Source,
    SourceContext,
)

__all__ = [
    "Activity",
    "ApiError",
    "ApiStatusError",
    "Artifact",
    "InvalidArgumentError",
    "MalformedResponseError",
    "NotFoundError",
    "PermissionDeniedError",
    "Plan",
    "PlanStep",
    "RateLimitedError",
    "RetryPolicy",
    "ServerError",
    "Session",
    "SessionState",
    "SessionsClient",
    "Source",
    "SourceContext",
    "TransportError",
    "UnauthenticatedError",
]
