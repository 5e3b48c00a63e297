"""The job service: one model of machines, nodes, queues, jobs and processes over every
backend, and the requests that act on it.  It speaks no protocol; front-ends do."""
