"""A concurrency campaign on a real object store (SeaweedFS): rounds in which producers,
compactors, subscribed readers, rollback, retention and garbage collection all run at once,
each for a bounded number of operations, checked after every round against a plain model
of every record produced.

* :mod:`tests.campaign.model` — the records produced, what every view of them must be;
* :mod:`tests.campaign.ops` — the workers' operations and how their outcomes are counted;
* :mod:`tests.campaign.checks` — what is checked once a round's workers are done;
* :mod:`tests.campaign.rounds` — a topic's rounds: the plan drawn from a seed, the threads,
  the summary.

``tests/storage/test_concurrency_campaign.py`` runs it: a short campaign in the normal
test command, a long one behind ``SHALE_LONG_TESTS=1``.
"""
