"""A package's options, declared once: `optkit package`'s flags (derived into cli/flagspec.py PACKAGE by
`python -m optkit.cli.derive`), a recipe's `package:` entries and `optkit.package.build.package(...)` all read
this model. It holds what every target shares; a target's own options are its `Config` (package/target.py),
given beside these as the same flat keys and flags, kept here as extra keys (`target_options`) until the chosen
target validates them (build.resolve): another target's option is refused naming the targets that take it."""
from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field
from pydantic import ValidationError as PydanticValidationError

from optkit.core.errors import UsageError
from optkit.core.registry import cli, flag_of

MAX_MEMORY_MARGIN = 10.0  # 1,000% over the measured peak


class PackageConfig(BaseModel):
    model_config = ConfigDict(extra="allow", allow_inf_nan=False)  # extra: the target's own, checked by it

    to: str = Field(description="The target: a registered package target's name (`optkit package --help` lists "
                                "them; a plugin's, see docs/internals.md).",
                    json_schema_extra=cli("--to", help="The package target."))
    output: str = Field(description="The repository folder (new, or one optkit made); in a recipe, relative to it.",
                        json_schema_extra=cli("--output", short="-o",
                                              help="The repository folder (new, or one optkit made)."))
    tuned: str | None = Field(default=None, description="best.json from `optkit tune` for this model (in a recipe, "
                                                        "the recipe's tune stage gives it).",
                              json_schema_extra=cli("--tuned", help="best.json from `optkit tune` for this model."))
    name: str | None = Field(default=None, description="Model name (default: the file's stem; a recipe's name).",
                             json_schema_extra=cli("--name", help="Model name (default: the file's stem)."))
    version: str = Field(default="auto", description="auto (the next number) or N (must be new).",
                         json_schema_extra=cli("--version"))
    tag: str | None = Field(default=None, description="A human tag recorded with the version, e.g. v1.1.",
                            json_schema_extra=cli("--tag"))
    report: str | None = Field(default=None, description="The report.json of the run that made the model (its "
                                                         "passes and measurements go in the lineage).",
                               json_schema_extra=cli("--report"))
    data: str | None = Field(default=None, description="Sample data: .npz, an image folder or IDX images; its "
                                                       "samples give the warm-up's dims.",
                             json_schema_extra=cli("--data", help=(
                                 "Sample data: .npz, an image folder or IDX images (an image of at most 64M pixels, by "
                                 "its header), or text (CSV, TSV, JSONL, Parquet, a datasets folder; tokenized by the "
                                 "model's own tokenizer); the command feeds it instead of random inputs (with labels, "
                                 "accuracy is measured too).")))
    shape: list[str] = Field(default_factory=list, description="Dims the warm-up needs where the model's are "
                                                                "dynamic: name=1x128 (repeatable; or the --data .npz's "
                                                                "samples).", json_schema_extra=cli("--shape"))
    manifests: str | None = Field(default=None, description="Also write deployment manifests: kserve,seldon,kubedl "
                                                            "(comma-separated).", json_schema_extra=cli("--manifests"))
    storage_uri: str | None = Field(default=None, description="Where the cluster reads REPO (s3://..., gs://..., "
                                                              "pvc://...).", json_schema_extra=cli("--storage-uri"))
    memory_margin: float | None = Field(default=None, ge=0, le=MAX_MEMORY_MARGIN,
                                        description="Margin on the measured peak memory (default 0.5 = 50%).",
                                        json_schema_extra=cli("--memory-margin"))
    capacity: str | None = Field(default=None, description="CAPACITY.json from `optkit capacity`: the manifests "
                                                           "carry its replicas, autoscaling and resources "
                                                           "(with --manifests).",
                                 json_schema_extra=cli("--capacity", help=(
                                     "CAPACITY.json from `optkit capacity`: replicas, autoscaling and resources "
                                     "in each manifest (with --manifests).")))
    stage: str | None = Field(default=None, description="Whose model (default: the last stage).",
                              json_schema_extra=cli(recipe_only="a recipe's stage; the command packages MODEL"))

    @classmethod
    def of(cls, options: dict, where: str = "") -> PackageConfig:
        """The config from a mapping (a command's flags, a recipe entry, keyword arguments); a bad one is one
        UsageError line naming the key and its flag."""
        try:
            return cls(**options)
        except PydanticValidationError as e:
            err = e.errors()[0]
            key = ".".join(str(p) for p in err["loc"]) or "package"
            flag = flag_of(cls, str(err["loc"][0])) if err["loc"] else None
            named = f"{key} ({flag})" if flag else key
            raise UsageError(f"{where}{named}: {str(err['msg']).splitlines()[0]}") from None

    @property
    def target_options(self) -> dict:
        """The keys given beside the shared ones: the chosen target's own options (or a mistake it refuses)."""
        return dict(self.model_extra or {})
