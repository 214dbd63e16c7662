"""A compaction run's settings (:class:`~shale.compactor.config.CompactionConfig`) are made
from the settings model: each field that is a setting takes the setting's default and its
check from the model, and a setting of ``compact`` that is neither the run's own nor a
field stops the import."""

from __future__ import annotations

import dataclasses

import pytest

from shale.compactor import config as config_module
from shale.compactor.config import RUN_WIDE, CompactionConfig
from shale.ledger.errors import InvalidInputError
from shale.settings import SETTINGS, Setting, resolve
from shale.settings.kinds import Whole

MADE = {f.name: SETTINGS[f.metadata["setting"]] for f in dataclasses.fields(CompactionConfig)
        if "setting" in f.metadata}


def test_every_setting_of_a_topics_run_is_a_field_made_from_the_model() -> None:
    compact = {s.name for s in SETTINGS.values() if "compact" in s.commands}
    assert {s.name for s in MADE.values()} == compact - RUN_WIDE
    for name, s in MADE.items():
        default = CompactionConfig.__dataclass_fields__[name].default
        if s.default_text is None and s.name != "no-gc":
            assert default == s.default, name  # the model's default, not one kept by hand


@pytest.mark.parametrize("name", sorted(n for n, s in MADE.items() if isinstance(s.kind, Whole)))
def test_each_field_is_checked_as_its_flag_is(name: str) -> None:
    kind = MADE[name].kind
    assert isinstance(kind, Whole)
    with pytest.raises(InvalidInputError, match=f"^{name}: "):
        CompactionConfig(**{name: kind.least - 1})


def test_a_runs_resolved_settings_fill_the_fields() -> None:
    s = resolve("compact", {"topics": ["/t"], "min-compaction-lag": 60_000, "no-gc": True, "workers": 2},
                {"SHALE_DELETE_RETENTION": "7d"})
    c = CompactionConfig.from_settings(s)
    assert (c.min_compaction_lag_ms, c.collect_garbage, c.workers, c.delete_retention_ms) == (
        60_000, False, 2, 7 * 86_400_000)


def test_a_new_setting_of_compact_must_be_a_field_or_the_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    new = Setting("max-widgets", Whole(), "a new knob", frozenset({"compact"}), default=3)
    monkeypatch.setattr(config_module, "SETTINGS", {**SETTINGS, new.name: new})
    with pytest.raises(TypeError, match="max-widgets"):
        config_module._check_complete()
