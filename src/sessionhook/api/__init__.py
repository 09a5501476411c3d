"""Typed async client of the Sessions API (``/v1alpha``): models, client, errors."""

from .client import SessionsClient
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
from .paging import ActivityPage, RefusedItem, SessionPage
from .retry import RetryPolicy

__all__ = [
    "Activity",
    "ActivityPage",
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
    "RefusedItem",
    "RetryPolicy",
    "ServerError",
    "Session",
    "SessionPage",
    "SessionState",
    "SessionsClient",
    "Source",
    "SourceContext",
    "TransportError",
    "UnauthenticatedError",
]
