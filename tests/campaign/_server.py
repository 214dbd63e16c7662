"""Imported by the fork server of :mod:`tests.campaign.procs` only: what the commands
import, once, so that a forked command starts with it.  NumPy's OpenBLAS is held to one
thread first, as a command holds it (``shale.cli._set_up_process``)."""

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import importlib

for _name in ("numpy", "boto3", "shale.cli.app", "shale.cli.parsing", "shale.cli.compact", "shale.cli.maintain",
              "shale.cli.produce", "shale.cli.read", "shale.cli.runlog", "shale.compactor.job",
              "shale.compactor.run_many", "shale.compactor.gc", "shale.compactor.retention",
              "shale.compactor.snapshots", "shale.compactor.verify", "shale.compactor.scrub",
              "shale.compactor.workers", "shale.compactor.pass_two", "shale.jsonl_ingest", "shale.jsonlines",
              "shale.producer", "shale.reader.topic_reader", "shale.reader.latest", "shale.storage._s3",
              "tests.campaign.procs"):
    importlib.import_module(_name)
