"""The parity harness: proves in-tree MLX models compute exactly what reference libraries compute.

Data flows one way: profile -> artifact -> (oracle run | in-tree run) -> comparison -> report.
"""

# Bumped when what a golden means changes (generator semantics, record layout); part of
# every golden's provenance, so a bump makes existing goldens stale rather than wrong.
HARNESS_VERSION = "0.1.0"
GOLDEN_FORMAT = 1
