"""The oracle seam: what each oracle is (descriptor.py), its venv (venvs.py), and the one way
its scripts run (process.py, OracleProcess)."""
