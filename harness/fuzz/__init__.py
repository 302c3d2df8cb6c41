"""Differential fuzzing against the oracle (docs/fuzz.md): Hypothesis draws scenarios, both
sides run them, the gates judge them, a failure is shrunk into a scenario a profile can keep."""
