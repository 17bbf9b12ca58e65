"""optkit-versions.json: a packaged model's version index (package/repo.py writes and reads it under the model
folder's lock): its target and name, each version with its tag, time, the sha256 of the model it serves and its
tuned label, which version is served, and the history of what was served when. serve-version checks a version's
lineage is for the model the index records for it.
"""
from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from optkit.contracts.base import Label, Name, Sha256, Strict, Tag, TargetName, Version, build
from optkit.core.text import redact_url

SCHEMA = "optkit-versions/1"
FILE = "optkit-versions.json"
HINT = "it is optkit's version index: restore it (or package into a new folder)"


class Registry(Strict):
    """Where an MLflow version was registered (optkit.package.registry): the URI as shown, without a password."""

    uri: Label
    version: Label | int
    alias: Label

    @model_validator(mode="after")
    def _no_secret(self):
        if redact_url(self.uri) != self.uri:
            raise ValueError("uri: holds a password or token; optkit stores a registry URI without it")
        return self


class VersionEntry(Strict):
    version: Version
    tag: Tag | None = None
    created: Label
    model_sha256: Sha256
    tuned: Label
    registry: Registry | None = None


class HistoryEntry(Strict):
    time: Label
    served: Version
    before: Version | None = None
    why: Label


class VersionIndex(Strict):
    schema_: Literal["optkit-versions/1"] = Field(alias="schema")
    target: TargetName
    name: Name
    versions: list[VersionEntry]
    served: Version | None = None
    history: list[HistoryEntry]
    parts: list[Name] = Field(default_factory=list)   # model folders an ensemble's versions own (Triton)

    @model_validator(mode="after")
    def _consistent(self):
        numbers = [v.version for v in self.versions]
        if len(set(numbers)) != len(numbers):
            raise ValueError("versions: a version is listed twice")
        tags = [v.tag for v in self.versions if v.tag is not None]
        if len(set(tags)) != len(tags):
            raise ValueError("versions: a tag is given to two versions")
        if self.served is not None and self.served not in numbers:
            raise ValueError(f"served: version {self.served} is not among the versions")
        return self


def document(data: dict) -> VersionIndex:
    """The index as package and serve-version write it: exit 3 if a reader would refuse it."""
    return build(VersionIndex, data, FILE)
