"""A study shown live where its users already look: MLflow and TensorBoard.

``spec`` holds what a study stores (:class:`Tracking`: an MLflow tracking URI and a
TensorBoard folder); ``tracker`` what each process that runs trials does with it (a run
per trial, per-epoch metrics, every variant's figures at the end). Calls to a tracker
go through ``_sender``: a thread of their own, so that a tracker that is down or slow
costs a trial nothing but one line in the log.
"""

from autosearch.tracking.spec import Tracking

__all__ = ["Tracking"]
