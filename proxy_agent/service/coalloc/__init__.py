"""Co-allocated multi-part jobs: one job made of parts that run under different schedulers,
started together behind a start barrier, with a runtime through which the parts' processes
learn the job's layout and exchange start-up data.

``description``  the multi-part job description (JSON and the multi-request form), pure
``rendezvous``   the hierarchical rendezvous and its data format, pure
``state``        the coordination state machine of one multi-part job, pure
``server``       the runtime server the job's processes talk to (trio)
"""
