"""Shale's compactor: plan, pass one, pass two, publish, garbage collection."""

__all__: list[str] = []
