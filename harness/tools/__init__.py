"""Tools beside the gate: benchmarks, calibration, mutation testing."""
