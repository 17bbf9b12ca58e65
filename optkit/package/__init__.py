"""`optkit package`: a model, its tuned serving settings and its lineage, as a folder a server loads (a Triton
model repository, an MLflow model), versioned for rollback. Nothing here talks to a server or a cluster."""
