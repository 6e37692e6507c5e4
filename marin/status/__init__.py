"""Status: the per-step status files, the experiment manifest and the publisher hook interface."""
