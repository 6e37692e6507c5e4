"""Execution: the executor's scheduling loop, its backends (local processes, Ray) and the worker side."""
