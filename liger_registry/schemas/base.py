"""The strict Pydantic base every YAML schema derives from."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class StrictModel(BaseModel):
    """Rejects unknown keys and validates on assignment, so a typo is an error, never a silent default."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, frozen=False)
