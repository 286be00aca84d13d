# MLflow, fed from the local files (the source of truth): an outage loses nothing and logging can be redone.


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
    conda:
        "../envs/specsweep.yaml"
    params:
        config=TRACKING_JSON,
    shell:
        "python -m specsweep track sweep --config {params.config:q} --variant {wildcards.variant} --arm {wildcards.arm}"
        " --out {output} {input.summaries} > {log} 2>&1"


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
    conda:
        "../envs/specsweep.yaml"
    params:
        config=TRACKING_JSON,
    shell:
        "python -m specsweep track crossover --config {params.config:q} --variant {wildcards.variant}"
        " --crossover {input.crossover} --out {output} {input.sweeps} > {log} 2>&1"
