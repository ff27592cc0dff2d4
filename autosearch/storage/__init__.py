"""Where a study is kept: storage URLs opened as Optuna storages (``_urls.py``; the RDB
storage's few-statement trial writes, ``_rdb.py``), the study's definition in its
storage (``stored.py``), and its weights and checkpoints in a folder or on S3
(``artifacts.py``, ``_s3.py``), under paths confined to their folder (``_paths.py``)."""
