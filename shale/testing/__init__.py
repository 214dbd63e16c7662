"""What Shale ships for testing: :mod:`shale.testing.storage`, the conformance suite a
storage backend (a ``shale.storage`` plugin among them) runs on its store.  Needs pytest."""
