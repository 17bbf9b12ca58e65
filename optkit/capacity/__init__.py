"""Capacity: per-replica figures (throughput at the latency objective, CPU, memory) turned into replicas and
autoscaling for a traffic history, replayed minute by minute before anything is deployed.

    replica.py   the per-replica figures, from a tune best.json, a bench report or a package's lineage
    traffic.py   a traffic history (CSV or a Prometheus range query) as one rate per minute, repairs stated
    hpa.py       the Kubernetes HPA (autoscaling/v2) rule, replayed minute by minute
    forecast.py  a seasonal forecast (statsmodels Holt-Winters) and the KEDA cron schedule it gives
    plan.py      the target search, the three strategies side by side and CAPACITY.json
    pictures.py  the console summary and the HTML page
"""
