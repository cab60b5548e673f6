"""The failover report: aggregation of both servers' failover event logs into an
availability report (tables, JSON summary, timeline picture).

``spark.job`` runs it on Spark, ``spark.reference`` is the plain-Python oracle it is tested
against, ``spark.model`` holds what both share, ``spark.cli`` is ``amqha report``.
"""
