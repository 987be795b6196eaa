"""Calibration studies: how often the gate's tests pass or fail when the truth is known.

Not part of what a run uses. These modules simulate and enumerate through the verdict's own
functions (harness.verdict, harness.run's seed check, analysis), which is why they live under
harness: analysis never imports harness, and a study of the floor or the seed gate must call them.
`make calibrate` (`python -m harness.calibration.report`) writes CALIBRATION.md from them.
`synthetic` builds records for tests and studies.
"""
