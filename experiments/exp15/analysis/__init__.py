"""Analyses of exp15's ladders (not benchmarks of the product): each a script run from the repository root.

- ``calibrate_e`` — the E a design fixes, from the family's committed rung and target records
  (:mod:`operators.scaling.calibrate`), and the forecasts it gives;
- ``end_rules`` — other endpoint rules, scored after the fact on the committed ladder records;
- ``seed_split`` — the init seed and the data-order seed of one rung trained apart;
- ``target_lr`` — the target trained at multiples of the rule's learning rate;
- ``variants`` — rungs under variant rules (``PROBE``), to probe the regime.

The commands and their recorded figures: docs/benchmarks/scaling-ladder.md.
"""
