"""Calibration studies: how often the gate's tests pass or fail when the truth is known.

Not part of the library that a run uses (analysis/ proper stays pure and small); these modules
simulate and enumerate, and `make calibrate` (`python -m analysis.calibration.report`) writes
CALIBRATION.md from them. `synthetic` builds records for tests and studies.
"""
