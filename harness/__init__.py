"""The parity harness: proves in-tree MLX models compute exactly what reference libraries compute.

Data flows one way: profile -> artifact -> (oracle run | in-tree run) -> comparison -> report.
"""

# Bumped when what a golden means changes (generator semantics, record layout); part of
# every golden's provenance, so a bump makes existing goldens stale rather than wrong.
HARNESS_VERSION = "0.1.0"
# Golden manifest formats: 1 names a full logits blob; 2 is compact (hashes, top-k, logsumexp).
FULL_GOLDEN_FORMAT = 1
COMPACT_GOLDEN_FORMAT = 2
GOLDEN_FORMAT = COMPACT_GOLDEN_FORMAT  # what new goldens are written in
