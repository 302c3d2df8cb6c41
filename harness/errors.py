"""One exception family, so every bad input ends in one clear message and a non-zero exit."""


class HarnessError(Exception):
    """Base of every error the harness reports to a user (no traceback needed)."""


class UsageError(HarnessError):
    """An argument a verb was given cannot be acted on (the CLI exits 2 with the verb's usage)."""


class ProfileError(HarnessError):
    """A profile file is malformed: names the file, the key and what was expected."""


class UnknownModelError(HarnessError):
    """A model name has no profile."""


class ArtifactError(HarnessError):
    """A pinned artifact cannot be resolved or does not match its pins."""


class OracleError(HarnessError):
    """The oracle venv cannot be built or its generator failed."""


class OracleVersionError(OracleError):
    """The oracle venv's mlx (or backend) differs from the project's: bits are not comparable."""


class GoldenError(HarnessError):
    """A golden is missing, corrupted or unreadable."""


class StaleGoldenError(GoldenError):
    """A golden's provenance no longer matches: regenerate it explicitly with `make goldens`."""


class RecordError(HarnessError):
    """A record has the wrong tensors (shape, dtype, missing keys)."""


class InTreeLoadError(HarnessError):
    """The in-tree implementation refused the artifact (unknown/missing tensors, bad config)."""


class NonDeterministicError(HarnessError):
    """An implementation gave different bits for the same inputs: its comparison is void."""


class NothingComparedError(HarnessError):
    """A check found nothing to compare (no rows, no tokens, no transcript): never a pass."""


class InTreeRunError(HarnessError):
    """The in-tree run did not do what its check asked of it (e.g. a compiled decode that fell back)."""
