"""SLURM on the batch engine (``--scheduler slurm``).

``parse`` holds the command lines and the parsers of their answers (JSON and text, every
release from 20.11 on); ``system`` SLURM's job states, node and partition states and how a
record becomes the engine's neutral one; ``directives`` the sbatch options a job's batch
settings become; ``backend`` the :class:`~..engine.BatchSystem` and backend that tie them
to the engine.
"""
