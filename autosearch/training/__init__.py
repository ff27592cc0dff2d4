"""The shared training stack every trial, supernet and export is trained with.

- ``train``: the training loop (``TrainConfig``, ``train``, ``evaluate``), the batch-size
  finder and the results of a run;
- ``runtime``: the device, DDP through ``torchrun``'s environment, mixed precision, seeds;
- ``_step``: one training step, eager or replayed from a CUDA graph, and the NaN watch;
- ``_feed``: each epoch's batches, drawn and augmented on the device, each rank its share;
- ``_optim``: the optimizers and learning-rate schedules (warm-up, cosine, one-cycle);
- ``_checkpoint``: a run's state after each epoch, resumed by the same run (or stopped
  after an epoch and continued with new settings: ``train(until=, adaptive=)``);
- ``sharding``: where a model trains on torchrun's ranks: whole (DDP) or sharded (FSDP,
  HSDP), and a sharded run's checkpoints (``torch.distributed.checkpoint``);
- ``precise_bn``: batch-norm statistics recomputed for the weights as they are (how a
  population's rounds rank members);
- ``early_stopping``: successive halving and Hyperband over a study's learning curves.

The data it reads is ``autosearch.data``. Nothing here imports Optuna: a trainer reports
each epoch to a callback.
"""
