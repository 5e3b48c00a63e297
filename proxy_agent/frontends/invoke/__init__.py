"""The Ninf-G Invoke Server protocol over the job service.

``protocol`` reads requests from bytes and writes replies and notifies (no I/O);
``request`` turns a JOB_CREATE into a job description and job states into the client's
statuses (no I/O); ``server`` runs one client's session over its three pipes against a
:class:`~.server.JobGateway`; ``agent`` is the gateway whose jobs are the agent's (the agent
serving the state directory, started when none does).
"""
