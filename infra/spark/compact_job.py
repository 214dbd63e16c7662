"""Entry point for ``spark-submit``: the ``compact`` command inside the application
spark-submit starts (its ``--master`` and ``--conf`` apply).

    spark-submit --master spark://host:7077 infra/spark/compact_job.py \\
        s3://bucket/topics/users --engine spark --json
"""

import sys

from shale.compactor.cli import main

if __name__ == "__main__":
    sys.exit(main())
