"""A weight-sharing study's supernet: its training as a job exactly one worker does, and
its evaluator (``job.py``), shown as it goes (``progress.py``), what the study stores of
it (``state.py``), its weights as a file of their own (``file.py``), and its choice
confirmed by training, where a ranker chooses what to train (``confirm.py``)."""
