"""Imported by the fork server of :mod:`tests.campaign.procs` only: what the commands
import, once, so that a forked command starts with it.  NumPy's OpenBLAS is held to one
thread first, as a command holds it (``shale.cli._set_up_process``)."""

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import importlib

for _name in ("numpy", "boto3", "shale.cli.app", "shale.cli.parsing", "shale.cli.compact", "shale.cli.maintain",
              "shale.cli.produce", "shale.cli.read", "shale.cli.runlog", "shale.compactor.job",
              "shale.compactor.run_many", "shale.maintenance.gc", "shale.maintenance.retention",
              "shale.maintenance.snapshots", "shale.maintenance.verify", "shale.maintenance.scrub",
              "shale.maintenance.status", "shale.compactor.workers", "shale.compactor.pass_two",
              "shale.producer.jsonl_ingest", "shale.producer.jsonlines", "shale.producer", "shale.reader.topic_reader",
              "shale.reader.latest", "shale.storage._s3", "tests.campaign.procs"):
    try:
        importlib.import_module(_name)
    except ImportError as e:  # (the fork server passes over an ImportError: every command would import it again)
        raise RuntimeError(f"tests/campaign/_server.py preloads {_name}, which is no more: {e}") from e
