"""Running an experiment's driver on a Ray cluster: `marin submit`, `marin jobs`, the driver-loss supervisor.

The driver of a submitted experiment is `python -m marin run SCRIPT ...` started by Ray's Jobs API on the
cluster; its code travels as the job's `working_dir` (the repository the script lives in), its credentials as
a sealed runtime-env module (never as job metadata or environment variables that Ray shows), and its job's
submission id is derived from the experiment's id so that a second submission of a live experiment attaches to
it. See docs/cluster-run.md.
"""
