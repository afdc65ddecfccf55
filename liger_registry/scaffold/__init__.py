"""`liger-registry scaffold`: draft a family entry from the installed transformers code, prove it, report."""

from liger_registry.scaffold.draft import Refused, draft, entry_yaml
from liger_registry.scaffold.prove import Parity, Proof, prove
from liger_registry.scaffold.scaffold import ScaffoldResult, scaffold

__all__ = ["Parity", "Proof", "Refused", "ScaffoldResult", "draft", "entry_yaml", "prove", "scaffold"]
