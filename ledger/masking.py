"""Secrets hidden from every text Shale shows: one function, used wherever an error,
a log line, a traceback or a setting is made into text.

What is a secret here:

* the credentials of a URI (``http://user:PASSWORD@host``, ``s3://KEY:SECRET@bucket``),
  wherever a URI appears in a text;
* the value of a ``NAME=VALUE`` pair whose name sounds secret (``password``, ``secret``,
  ``token``, ``credential``, ``signature``, ``sig``, ``access key``, ``session``, ``api
  key``, ``private key``): query parameters of a presigned URL (``X-Amz-Signature``,
  ``X-Amz-Credential``, ``X-Amz-Security-Token``, ``Signature``, ``sig``), settings
  (``spark.hadoop.fs.s3a.secret.key=...``) and the like in free text;
* a whole value whose own name sounds secret (``AWS_SECRET_ACCESS_KEY``).

It is a pure text rewrite, so it cannot fail on a URI no parser accepts, and masking a
masked text changes nothing.
"""

from __future__ import annotations

import re
from typing import Final

__all__ = ["MASK", "MaskedCause", "mask_secrets", "masked_cause", "secret_name", "userinfo"]

MASK: Final = "****"

# every URI in a text, up to the next white space or quote
_URI: Final = re.compile(r"(?P<head>[A-Za-z][A-Za-z0-9+.\-]*://)(?P<rest>[^\s'\"]+)")
_SECRET_WORD: Final = re.compile(
    r"secret|passw(?:or)?d|token|credential|signature|access[._-]?key|session|api[._-]?key|private[._-]?key", re.I)
#: names that are secrets although they hold none of the words above (Azure's SAS signature)
_SECRET_NAMES: Final = frozenset({"sig", "pwd"})
# NAME=VALUE anywhere in a text: the value runs to the next separator of a query, a
# list or a sentence
_PAIR: Final = re.compile(r"(?P<name>[A-Za-z0-9_.\-]+)=(?P<value>[^&\s'\";,)\\]*)")


def secret_name(name: str) -> bool:
    """Whether a setting, variable or parameter called ``name`` holds a secret."""
    return bool(_SECRET_WORD.search(name)) or name.lower() in _SECRET_NAMES


def userinfo(rest: str) -> str:
    """The credentials at the start of a URI's authority ("" when it has none): up to the
    last ``@``, which parsers split at; secrets may hold ``/``, ``:`` and ``@``."""
    at = rest.rfind("@")
    if at < 0:
        return ""
    info = rest[:at]
    return info if ":" in info or "/" not in info else ""


def _hide_userinfo(m: re.Match[str]) -> str:
    head, rest = m.group("head"), m.group("rest")
    info = userinfo(rest)
    if not info or info == MASK:
        return m.group(0)
    user, sep, _ = info.partition(":")
    # a lone token, or an access key id (upper case), is a secret too
    shown = f"{user}:{MASK}" if sep and user and "/" not in user and not user.isupper() else MASK
    return f"{head}{shown}@{rest[len(info) + 1:]}"


def _hide_pair(m: re.Match[str]) -> str:
    name = m.group("name")
    if not m.group("value") or not secret_name(name):
        return m.group(0)
    return f"{name}={MASK}"


def mask_secrets(text: str, name: str = "") -> str:
    """``text`` with every secret in it hidden as ``****`` (see the module's docstring);
    all of it when ``name``, the name of the setting it is the value of, sounds secret."""
    if name and secret_name(name):
        return MASK if text else text
    key, sep, _ = text.partition("=")
    if sep and "://" not in key and not any(c.isspace() for c in key.strip()) and secret_name(key):
        return f"{key}={MASK}"  # a KEY=VALUE setting: the value may hold anything
    if "://" in text:
        text = _URI.sub(_hide_userinfo, text)
    if "=" in text:
        text = _PAIR.sub(_hide_pair, text)
    return text


class MaskedCause(Exception):
    """Stands in for an exception whose text carried a secret, as the cause of the error it
    was translated into: its class is named, its text masked."""


def masked_cause(e: BaseException) -> BaseException:
    """``e``, to chain a translated error to (``raise ... from masked_cause(e)``), or a
    :class:`MaskedCause` with its text masked when its text (or its own cause's) carries
    a secret: a traceback, a log line or a program looking at ``__cause__`` then never
    sees it."""
    chain: list[BaseException] = []
    link: BaseException | None = e
    while link is not None and len(chain) < 8:
        chain.append(link)
        link = link.__cause__ or (None if link.__suppress_context__ else link.__context__)
    texts = [f"{type(x).__module__}.{type(x).__qualname__}: {x}" for x in chain]
    if all(mask_secrets(t) == t for t in texts):
        return e
    stand_in = MaskedCause(mask_secrets(f"{type(e).__qualname__}: {e}"))
    stand_in.__traceback__ = e.__traceback__  # where it happened, which holds no secret
    return stand_in
