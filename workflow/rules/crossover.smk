# The answer per variant: crossover with its interval, plots, policy; and variants side by side.


rule crossover_variant:
    """Speedup of each speculative arm over the baseline per level, the crossover and the policy."""
    input:
        summaries=variant_cells,
        requests=lambda w: variant_cells(w, "requests.parquet"),
        env=lambda w: expand(rules.env.output[0], variant=unit_variant(w.variant)),
        schedule=schedule_input,
    output:
        crossover=report(
            RES / "{variant}" / "crossover.json",
            category="Crossover",
            subcategory="{variant}",
            caption="../report/crossover.rst",
            labels={"variant": "{variant}", "figure": "crossover table"},
        ),
        policy=report(
            RES / "{variant}" / "policy.yaml",
            category="Crossover",
            subcategory="{variant}",
            caption="../report/policy.rst",
            labels={"variant": "{variant}", "figure": "policy"},
        ),
        plots=report(
            directory(RES / "{variant}" / "plots"),
            patterns=["{name}.png"],
            category="Plots",
            subcategory="{variant}",
            caption="../report/plots.rst",
            labels={"variant": "{variant}", "figure": "{name}"},
        ),
    log:
        LOGS / "crossover" / "{variant}.log",
    benchmark:
        RES / "benchmarks" / "crossover.{variant}.tsv"
    conda:
        "../envs/specsweep.yaml"
    params:
        config=variant_analysis_json,
        out_dir=lambda w: RES / w.variant,
        schedule=lambda w, input: f"--schedule {input.schedule}" if input.schedule else "",
    shell:
        "python -m specsweep crossover --variant {wildcards.variant} --config {params.config:q}"
        " --summaries {input.summaries} {params.schedule} --out-dir {params.out_dir} > {log} 2>&1"


rule contents:
    """A variant's answer per content class and for its traffic mix, side by side (disagreements first)."""
    input:
        lambda w: [RES / u / "crossover.json" for u in UNITS if unit_variant(u) == w.variant],
    output:
        report(
            RES / "{variant}" / "contents.json",
            category="Crossover",
            subcategory="{variant}",
            caption="../report/contents.rst",
            labels={"variant": "{variant}", "figure": "content classes"},
        ),
    log:
        LOGS / "contents" / "{variant}.log",
    benchmark:
        RES / "benchmarks" / "contents.{variant}.tsv"
    conda:
        "../envs/specsweep.yaml"
    params:
        mix=f"--mix {shlex.quote(dumps(config['workload']['mix']))}" if config["workload"]["mix"] else "",
    shell:
        "python -m specsweep contents --variant {wildcards.variant} --crossovers {input} {params.mix}"
        " --out {output} > {log} 2>&1"


rule compare:
    """The same arm's curves across variants, with ratios per level."""
    input:
        [RES / v / "crossover.json" for v in HEADLINE_UNITS],
    output:
        report(
            RES / "comparison" / "comparison.json",
            category="Comparison",
            caption="../report/compare.rst",
            labels={"figure": "variants compared"},
        ),
    log:
        LOGS / "comparison.log",
    benchmark:
        RES / "benchmarks" / "compare.tsv"
    conda:
        "../envs/specsweep.yaml"
    params:
        config=dumps(analysis_spec(config, HEADLINE_UNITS)),
        experiment_dir=RES,
        out_dir=RES / "comparison",
    shell:
        "python -m specsweep compare --config {params.config:q} --experiment-dir {params.experiment_dir} --out-dir {params.out_dir} > {log} 2>&1"
