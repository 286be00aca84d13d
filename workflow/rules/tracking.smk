# MLflow, fed from the local files (the source of truth): an outage loses nothing and logging can be redone.
# A job that cannot log fails fast (mlflow.http_*) and repeats its one-line reason (server, fix) on Snakemake's
# stderr; the rest stays in its log. The jobs run after every local one (priority below the default 0): Snakemake
# stops starting jobs after a failed one, and a server that is down must not keep cells or the analysis from
# being written.

from specsweep.tracking.uri import credentials_to_env

# A user:password@ in mlflow.tracking_uri goes to MLflow's variables, which the jobs inherit: TRACKING_JSON
# (a param Snakemake prints) holds the URI without it.
credentials_to_env(config["mlflow"]["tracking_uri"])


rule track_variant:
    """One variant's MLflow runs, in one job: a sweep run per arm (metrics with step = concurrency, its cell runs
    nested under it), then the crossover run (crossover and interval, plots, policy). One job rather than one per
    arm: each job pays ~2.5 s of importing MLflow, and unchanged cells are not logged again."""
    input:
        summaries=variant_cells,
        crossover=RES / "{variant}" / "crossover.json",
    output:
        sweeps=expand(RES / "{{variant}}" / "{arm}" / "mlflow_sweep.json", arm=ARMS),
        crossover=RES / "{variant}" / "mlflow_crossover.json",
    log:
        LOGS / "tracking" / "{variant}.log",
    benchmark:
        RES / "benchmarks" / "track_variant.{variant}.tsv"
    priority: -1
    conda:
        "../envs/specsweep.yaml"
    params:
        config=TRACKING_JSON,
    shell:
        "python -m specsweep track variant --config {params.config:q} --variant {wildcards.variant}"
        " --crossover {input.crossover} --out {output.crossover} --sweeps {output.sweeps} --cells {input.summaries}"
        " > {log} 2>&1 || {{ grep '^specsweep track:' {log} >&2; exit 1; }}"
