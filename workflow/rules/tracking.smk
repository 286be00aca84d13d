# MLflow, fed from the local files (the source of truth): an outage loses nothing and logging can be redone.
# A job that cannot log fails fast (mlflow.http_*) and repeats its one-line reason (server, fix) on Snakemake's
# stderr; the rest stays in its log. The jobs run after every local one (priority below the default 0): Snakemake
# stops starting jobs after a failed one, and a server that is down must not keep cells or the analysis from
# being written.

from specsweep.tracking.uri import credentials_to_env

# A user:password@ in mlflow.tracking_uri goes to MLflow's variables, which the jobs inherit: TRACKING_JSON
# (a param Snakemake prints) holds the URI without it.
credentials_to_env(config["mlflow"]["tracking_uri"])


rule track_sweep:
    """One sweep run per variant x arm (metrics with step = concurrency), its cell runs nested under it."""
    input:
        summaries=arm_cells,
    output:
        RES / "{variant}" / "{arm}" / "mlflow_sweep.json",
    log:
        LOGS / "tracking" / "{variant}.{arm}.log",
    benchmark:
        RES / "benchmarks" / "track_sweep.{variant}.{arm}.tsv"
    priority: -1
    conda:
        "../envs/specsweep.yaml"
    params:
        config=TRACKING_JSON,
    shell:
        "python -m specsweep track sweep --config {params.config:q} --variant {wildcards.variant} --arm {wildcards.arm}"
        " --out {output} {input.summaries} > {log} 2>&1 || {{ grep '^specsweep track:' {log} >&2; exit 1; }}"


rule track_crossover:
    """One crossover run per variant: crossover concurrency and interval, plots and policy."""
    input:
        crossover=RES / "{variant}" / "crossover.json",
        sweeps=lambda w: [RES / w.variant / a / "mlflow_sweep.json" for a in ARMS],
    output:
        RES / "{variant}" / "mlflow_crossover.json",
    log:
        LOGS / "tracking" / "{variant}.crossover.log",
    benchmark:
        RES / "benchmarks" / "track_crossover.{variant}.tsv"
    priority: -1
    conda:
        "../envs/specsweep.yaml"
    params:
        config=TRACKING_JSON,
    shell:
        "python -m specsweep track crossover --config {params.config:q} --variant {wildcards.variant}"
        " --crossover {input.crossover} --out {output} {input.sweeps} > {log} 2>&1"
        " || {{ grep '^specsweep track:' {log} >&2; exit 1; }}"
