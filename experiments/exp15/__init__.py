"""exp15 (the scaling ladder, experiments/exp15_scaling_ladder.py): its analyses live in :mod:`.analysis`."""
