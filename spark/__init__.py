"""Views and aggregates over the live contents of qlayer queues, built with PySpark.

The views arrive with the Spark issue: they read the underlying topics and the coordinator's
changelog (``avro/changelog_*.avsc``) and never lease. Until then this package is empty.
"""

__all__: list[str] = []
