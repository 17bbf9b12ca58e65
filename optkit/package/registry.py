"""An MLflow model registry, when one is configured (`--registry URI` or MLFLOW_REGISTRY_URI): each MLflow package
version is registered (source: its folder) and the alias `served` points at the version optkit serves, so
`models:/NAME@served` follows packaging and serve-version. No registry: the index alone records it."""
from __future__ import annotations

import os
from pathlib import Path

from optkit.core.errors import PassError

ALIAS = "served"


def uri(given: str | None) -> str | None:
    return given or os.environ.get("MLFLOW_REGISTRY_URI") or None


def _client(registry: str):
    from mlflow import MlflowClient

    return MlflowClient(tracking_uri=registry, registry_uri=registry)


def register(registry: str, name: str, version_dir: Path, number: int, tag: str | None) -> str:
    """Register the package version; point the alias at it. Returns the registry's version number."""
    try:
        client = _client(registry)
        from mlflow.exceptions import MlflowException

        try:
            client.get_registered_model(name)
        except MlflowException:
            client.create_registered_model(name, tags={"managed-by": "optkit"})
        tags = {"optkit.version": str(number), **({"optkit.tag": tag} if tag else {})}
        mv = client.create_model_version(name, source=str(version_dir.resolve()), tags=tags)
        client.set_registered_model_alias(name, ALIAS, mv.version)
        return str(mv.version)
    except PassError:
        raise
    except Exception as e:
        raise PassError(f"version {number} is written at {version_dir}, but the registry {registry} refused it "
                        f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}); fix the registry and run "
                        f"optkit package serve-version {version_dir.parent} --version {number} --registry ...") from None


def point_alias(registry: str, name: str, version_dir: Path, number: int, tag: str | None,
                known: str | None) -> tuple[str, str | None]:
    """Point `served` at the registry version of package version `number` (registering it when it is not yet).
    Returns (the registry version now served, the one served before or None)."""
    from mlflow.exceptions import MlflowException

    client = _client(registry)
    try:
        before = client.get_model_version_by_alias(name, ALIAS).version
    except MlflowException:
        before = None
    if known is None:
        return register(registry, name, version_dir, number, tag), before
    try:
        client.set_registered_model_alias(name, ALIAS, known)
    except MlflowException as e:
        raise PassError(f"the registry {registry} refused the alias: {str(e).splitlines()[0]}") from None
    return known, before
