"""Every setting of every command, defined once (:mod:`shale.settings.model`), the kinds
of value they take (:mod:`shale.settings.kinds`), and the one precedence rule that gives
each its value (:mod:`shale.settings.resolve`):

    a run's flag > the topic's policy > a ``SHALE_*`` variable > the default

>>> from shale.settings import resolve
>>> s = resolve("compact", {"parallel": 4}, {"SHALE_DELETE_RETENTION": "7d"})
>>> s.value("parallel"), s.source("parallel"), s.value("delete-retention"), s.source("delete-retention")
(4, <Source.FLAG: 'flag'>, 604800000, <Source.ENV: 'env'>)
"""

from shale.settings.model import (
           COMMANDS,
           ENV_PREFIX,
           POLICY_SETTINGS,
           SETTINGS,
           VARIABLES,
           Setting,
           Variable,
           settings_for,
)
from shale.settings.resolve import Settings, Source, Value, VariableError, resolve

__all__ = ["COMMANDS", "ENV_PREFIX", "POLICY_SETTINGS", "SETTINGS", "VARIABLES", "Setting", "Settings", "Source",
           "Value", "Variable", "VariableError", "resolve", "settings_for"]
