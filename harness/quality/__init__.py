"""Quantization quality of a candidate against its control, measured apart from parity."""
