"""Front-ends: the protocols the job service is spoken in."""
