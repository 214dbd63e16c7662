"""Sizes and durations as people type them: :mod:`shale.settings.units`, where every
setting's values are defined (kept here for the names it had)."""

from shale.settings.units import MAX_BYTES, MAX_MILLIS, format_duration, format_size, parse_duration, parse_size

__all__ = ["MAX_BYTES", "MAX_MILLIS", "format_duration", "format_size", "parse_duration", "parse_size"]
