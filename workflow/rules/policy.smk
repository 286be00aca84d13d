# The policy arm: the schedule derived from the fixed arms, served and measured as an arm of its own.


checkpoint schedule:
    """Derive each speculative arm's schedule (K per running requests) from the fixed arms' cells."""
    input:
        summaries=fixed_cells,
        requests=lambda w: fixed_cells(w, "requests.parquet"),
    output:
        RES / "{variant}" / "schedule.json",
    log:
        LOGS / "schedule" / "{variant}.log",
    benchmark:
        RES / "benchmarks" / "schedule.{variant}.tsv"
    conda:
        "../envs/specsweep.yaml"
    params:
        decision=schedule_decision_json,
        judging=variant_analysis_json,
    shell:
        "python -m specsweep schedule --variant {wildcards.variant} --decision {params.decision:q}"
        " --judging {params.judging:q} --summaries {input.summaries} --out {output} > {log} 2>&1"
