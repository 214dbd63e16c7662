"""What the stores need to reach storage, as one value: :class:`StorageOptions`.

The options are read from the environment once, at the edge (the command line, and the
public entry points when given none), and then travel as a value: a store keeps the
options it was opened with and pickles with them, so a process it is sent to (a Spark
executor, a worker) reaches the same storage with the same settings without anything
being written to its environment.  What the options leave unset, the process that opens
the store finds on its own (boto3's chain of profiles, web identity and instance roles;
fsspec's own configuration).

Their ``repr`` shows every secret as ``****`` (:func:`~shale.ledger.masking.mask_secrets`);
their pickle holds the values, which is what sending them to another process is for.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import field
from typing import Any, Final

from shale.ledger.errors import InvalidInputError
from shale.ledger.masking import mask_secrets
from shale.ledger.values import dataclass
from shale.settings.model import VARIABLES, Variable
from shale.storage.retry import RetryPolicy

__all__ = ["ADDRESSING_STYLES", "CREDENTIAL_FIELDS", "S3Options", "StorageOptions"]

#: The values ``addressing_style`` takes (botocore's).
ADDRESSING_STYLES: Final = ("auto", "virtual", "path")

#: The S3 settings that say who Shale is (left out by :meth:`StorageOptions.without_credentials`).
CREDENTIAL_FIELDS: Final = ("profile", "access_key_id", "secret_access_key", "session_token", "role_arn",
                            "web_identity_token_file", "role_session_name")

_SECONDS: Final = ("connect_timeout", "read_timeout")


@dataclass(frozen=True, slots=True, repr=False)
class S3Options:
    """How the ``s3://`` backend reaches S3 (or MinIO, R2, moto ...).  ``None`` leaves a
    setting to boto3 in the process that opens the store."""

    endpoint_url: str | None = None
    region: str | None = None
    profile: str | None = None
    access_key_id: str | None = None
    secret_access_key: str | None = None
    session_token: str | None = None
    role_arn: str | None = None
    web_identity_token_file: str | None = None
    role_session_name: str | None = None
    ca_bundle: str | None = None
    sts_regional_endpoints: str | None = None
    addressing_style: str = "auto"
    connect_timeout: float = 10.0
    read_timeout: float = 60.0
    #: the variable each setting was read from, so that a message names what the user set
    origins: tuple[tuple[str, str], ...] = ()
    #: settings that did not parse, as messages: refused when a client is made, so that a
    #: bad S3 variable does not stop a command that never touches S3
    problems: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.addressing_style not in ADDRESSING_STYLES:
            raise InvalidInputError(f"addressing_style {self.addressing_style!r}: "
                                    f"one of {', '.join(ADDRESSING_STYLES)}")
        for name in _SECONDS:
            if not getattr(self, name) > 0:
                raise InvalidInputError(f"{name} {getattr(self, name)!r}: must be more than 0 seconds")

    @classmethod
    def from_environment(cls, environ: Mapping[str, str] | None = None) -> S3Options:
        """The settings the standard AWS variables (and Shale's ``SHALE_S3_*``) give: the
        settings model's variables of the ``s3.`` fields (:data:`shale.settings.VARIABLES`)."""
        found = _from_variables("s3.", os.environ if environ is None else environ)
        return cls(**found.values, origins=found.origins, problems=found.problems)

    def named(self, setting: str) -> str:
        """What the user calls ``setting``: the variable it was read from, else its name."""
        return dict(self.origins).get(setting, setting)

    def without_credentials(self) -> S3Options:
        return dataclasses.replace(self, profile=None, access_key_id=None, secret_access_key=None, session_token=None,
                                   role_arn=None, web_identity_token_file=None, role_session_name=None)

    def __repr__(self) -> str:
        shown = (f"{f.name}={mask_secrets(str(v), f.name)!r}" for f in dataclasses.fields(self)
                 if f.name not in ("origins", "problems") and (v := getattr(self, f.name)) != f.default)
        return f"S3Options({', '.join(shown)})"


@dataclass(frozen=True, slots=True, repr=False)
class StorageOptions:
    """Everything the stores need, for every scheme: S3's settings, the retry policy of
    transient storage errors, and fsspec's storage options by scheme (``{"gcs":
    {"project": ...}}``, passed to ``fsspec.filesystem``).  Frozen and picklable."""

    s3: S3Options = field(default_factory=S3Options)
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    fsspec: Mapping[str, Mapping[str, Any]] = field(default_factory=dict, hash=False)

    def __post_init__(self) -> None:
        # a copy of the caller's mappings, so that changing them later changes no store
        object.__setattr__(self, "fsspec", {str(k): dict(v) for k, v in self.fsspec.items()})

    @classmethod
    def from_environment(cls, environ: Mapping[str, str] | None = None) -> StorageOptions:
        """The options the environment gives now (``environ``, else this process's):
        S3's settings, and ``SHALE_S3_ATTEMPTS``, how many times a transient S3 failure is
        tried before it is given up (the retry policy's ``attempts``).  fsspec's own
        configuration is read by fsspec where a store is opened."""
        env = os.environ if environ is None else environ
        s3 = S3Options.from_environment(env)
        retry = _from_variables("retry.", env)
        if retry.problems:
            # like a bad S3 variable: refused by the first S3 request, not by commands that never make one
            return cls(s3=dataclasses.replace(s3, problems=(*s3.problems, *retry.problems)))
        return cls(s3=s3, retry=RetryPolicy(**retry.values)) if retry.values else cls(s3=s3)

    def without_credentials(self) -> StorageOptions:
        """The same options without the S3 credentials and profile: a process given these
        uses an identity of its own."""
        return dataclasses.replace(self, s3=self.s3.without_credentials())

    def fsspec_options(self, scheme: str) -> dict[str, Any]:
        """The storage options for fsspec's ``scheme`` filesystem."""
        return dict(self.fsspec.get(scheme, {}))

    def __repr__(self) -> str:
        fs = {scheme: {k: mask_secrets(str(v), k) for k, v in opts.items()} for scheme, opts in self.fsspec.items()}
        return f"StorageOptions(s3={self.s3!r}, retry={self.retry!r}, fsspec={fs!r})"

    __str__ = __repr__


@dataclass(frozen=True, slots=True)
class _Found:
    """What the variables of one group of fields gave: the values, by field, the variable
    each came from, and why those that could not be taken were not."""

    values: dict[str, Any]
    origins: tuple[tuple[str, str], ...]
    problems: tuple[str, ...]


def _from_variables(group: str, env: Mapping[str, str]) -> _Found:
    """The fields under ``group`` (``s3.``) that the settings model's variables set in
    ``env``: for each field, the first of its variables that is set."""
    by_field: dict[str, list[Variable]] = {}
    for v in VARIABLES.values():
        if v.target.startswith(group):
            by_field.setdefault(v.target.removeprefix(group), []).append(v)
    values: dict[str, Any] = {}
    origins, problems = [], []
    for name, variables in by_field.items():
        given = next((v for v in variables if env.get(v.name)), None)
        if given is None:
            continue
        try:
            values[name] = given.kind.parse(env[given.name])
        except InvalidInputError:
            problems.append(f"{given.name} {env[given.name]!r}: {given.expected}")
            continue
        origins.append((name, given.name))
    return _Found(values, tuple(origins), tuple(problems))

