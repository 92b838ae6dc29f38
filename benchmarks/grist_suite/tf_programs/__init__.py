"""The TensorFlow programs of the GRIST benchmark, re-expressed as CDeepFuzz targets (one module per subject).

Each module's docstring names the subject, the original's path in github.com/Jacob-yen/GRIST and the
data it trains on here; :mod:`benchmarks.grist_suite.subjects_tf` lists them. Shared data stand-ins and
initialisers live in :mod:`benchmarks.grist_suite.tf_programs._common`.
"""
