# Adaptive levels: after the grid, rounds that add levels inside the crossover interval (docs/analysis.md).


checkpoint refine:
    """Judge every cell measured so far and choose the levels to add inside the crossover interval."""
    input:
        summaries=round_cells,
        requests=lambda w: round_cells(w, "requests.parquet"),
    output:
        RES / "{variant}" / "adaptive" / "round{round}.json",
    log:
        LOGS / "adaptive" / "{variant}.round{round}.log",
    benchmark:
        RES / "benchmarks" / "refine.{variant}.round{round}.tsv"
    wildcard_constraints:
        round=r"[1-9]",
    conda:
        "../envs/specsweep.yaml"
    params:
        adaptive=refine_json,
        judging=variant_analysis_json,
    shell:
        "python -m specsweep refine --variant {wildcards.variant} --round {wildcards.round}"
        " --adaptive {params.adaptive:q} --judging {params.judging:q} --summaries {input.summaries} --out {output}"
        " > {log} 2>&1"
