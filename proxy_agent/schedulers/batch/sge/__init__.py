"""Grid Engine on the batch engine (``--scheduler sge``).

``system`` holds the commands and the job state table; ``parse`` the parsers of the
commands' XML and text answers; ``directives`` the qsub options a job becomes; ``backend``
the :class:`~..engine.BatchSystem` and backend that tie them to the engine.
"""
