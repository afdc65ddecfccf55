"""Values shared across the package, defined once."""

IGNORE_INDEX = -100  # the label transformers and torch's cross entropy skip
