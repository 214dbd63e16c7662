"""The storage settings executors need, sent with the tasks instead of through Spark's
configuration (which Spark shows in its UI and event log).

Endpoint and region always travel, so executors reach the same store as the driver;
static credentials travel unless turned off.  The values never appear in a ``repr``,
a log line or an error message: only the variable names do.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Final

from shale.storage import clear_backend_cache

__all__ = ["CREDENTIAL_VARIABLES", "SETTING_VARIABLES", "ForwardedEnvironment"]

SETTING_VARIABLES: Final = ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_REGION", "AWS_DEFAULT_REGION",
                            "AWS_CA_BUNDLE", "AWS_STS_REGIONAL_ENDPOINTS")
CREDENTIAL_VARIABLES: Final = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN",
                               "AWS_ROLE_ARN", "AWS_WEB_IDENTITY_TOKEN_FILE", "AWS_ROLE_SESSION_NAME")


@dataclass(frozen=True, slots=True, repr=False)
class ForwardedEnvironment:
    """Environment variables captured on the driver and applied on each executor."""

    values: tuple[tuple[str, str], ...] = ()

    @classmethod
    def capture(cls, *, credentials: bool = True) -> ForwardedEnvironment:
        names = SETTING_VARIABLES + (CREDENTIAL_VARIABLES if credentials else ())
        return cls(tuple((k, os.environ[k]) for k in names if k in os.environ))

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(k for k, _ in self.values)

    def apply(self) -> None:
        """Set the variables in this (executor) process; stores are re-made if any changed."""
        changed = False
        for k, v in self.values:
            if os.environ.get(k) != v:
                os.environ[k] = v
                changed = True
        if changed:
            clear_backend_cache()

    def __repr__(self) -> str:
        return f"ForwardedEnvironment(names={list(self.names)!r})"

    __str__ = __repr__
