"""The files one optkit command writes for another, one typed model each, owned by its writer and used both ways:
the writer builds the model and serializes it (strict JSON, core/strictjson.py), every reader validates the file
against it (exit 2 naming the file and the key). Each records the sha256 of the model its figures are for, and
readers refuse another model's file (base.same_model).

    best.py      best.json (`optkit tune -o`)
    capacity.py  CAPACITY.json (`optkit capacity -o`)
    split.py     split.json (`optkit split -o DIR`)
    lineage.py   optkit-package.json, a package version's lineage
    index.py     optkit-versions.json, a packaged model's version index
    files.py     the record of one file (reports and lineage)
    base.py      bounds, strict and open models, reading, building, the model check
"""
