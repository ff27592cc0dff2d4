"""How a candidate is evaluated, one trial at a time.

- ``trial``: what the study hands the runner (``TrialPlan``) and what it gets back
  (``TrialResult``);
- ``runner``: a whole trial: build, train (or look up, or inherit), derive the variants,
  measure their costs, score them;
- ``tabular``: evaluation by looking a candidate up in a benchmark table;
- ``supernet``: weight sharing: a supernet trained with the sandwich rule, and its
  subnets evaluated with inherited weights and recalibrated batch norm.

The runner knows nothing of storage: the study stores what it returns.
"""
