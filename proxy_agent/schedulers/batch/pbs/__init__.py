"""PBS (OpenPBS, PBS Professional and Torque) on the batch engine (``--scheduler pbs``).

``system`` holds each family's commands and state tables; ``parse`` the parsers of their
JSON, XML and text answers; ``directives`` the qsub options a job becomes; ``backend`` the
:class:`~..engine.BatchSystem` and backend that tie them to the engine.
"""
