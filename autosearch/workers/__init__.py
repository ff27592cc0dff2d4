"""Who runs a study's trials: a local pool of worker processes and torchrun ranks
(``pool.py``), local processes, Ray tasks or Slurm jobs (``executors.py``; a Ray head
checked before connecting, ``_ray_connect.py``; CUDA MPS for shared GPUs, ``_mps.py``),
each trial's heartbeat (``_heartbeat.py``), graceful Ctrl-C and SIGTERM
(``interrupts.py``), and the failpoints a chaos test kills workers at
(``_failpoints.py``)."""
