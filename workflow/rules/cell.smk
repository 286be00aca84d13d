# One cell: variant x arm x level (all repeats): c<C> (closed loop), r<requests/s> (open), t<time scale> (trace). The unit of measurement and of --forcerun.


rule cell:
    """Measure one cell against its arm's server (started once per arm and reused across its cells)."""
    input:
        unpack(cell_inputs),
    output:
        requests=RES / "{variant}" / "{arm}" / "{level}" / "requests.parquet",
        summary=report(
            RES / "{variant}" / "{arm}" / "{level}" / "summary.json",
            category="Cells",
            caption="../report/cell.rst",
            subcategory="{variant}",
            labels={"variant": "{variant}", "arm": "{arm}", "level": "{level}"},
        ),
    log:
        LOGS / "cells" / "{variant}.{arm}.{level}.log",
    benchmark:
        RES / "benchmarks" / "cell.{variant}.{arm}.{level}.tsv"
    wildcard_constraints:
        level=r"c\d+|[rt]\d+(\.\d+)?",
    priority: cell_priority_of
    conda:
        "../envs/specsweep.yaml"
    threads: MEASURE_THREADS
    resources:
        startup_timeout_s=lambda w: startup_timeout_s(config, w.variant),
        # locally MEASURE_THREADS runs a measurement alone; on a cluster each job is a host of its own and a
        # server's cells run one after another in its job (workflow/profiles/slurm groups them and scopes this
        # resource to the job)
        measure=1,
        slurm_partition=slurm("slurm_partition"),
        slurm_account=slurm("slurm_account"),
        gpu=slurm("gpu"),
        cpus_per_task=slurm("cpus_per_task"),
        mem_mb=slurm("mem_mb"),
        runtime=slurm("runtime"),
        constraint=slurm("constraint"),
        qos=slurm("qos"),
        slurm_extra=slurm("slurm_extra"),
    params:
        spec=cell_spec_json,
        out_dir=lambda w: RES / w.variant / w.arm / w.level,
        state_dir=STATE_DIR,
        server_logs=LOGS / "servers",
    shell:
        "python -m specsweep cell --spec {params.spec:q} --env {input.env} --out-dir {params.out_dir}"
        " --state-dir {params.state_dir} --server-log-dir {params.server_logs}"
        " --startup-timeout-s {resources.startup_timeout_s} > {log} 2>&1"


rule paired_level:
    """Measure one level of every fixed arm in interleaved blocks, all servers up at once (pairing.mode)."""
    input:
        unpack(paired_inputs),
    output:
        requests=expand(RES / "{{variant}}" / "{arm}" / "{{level}}" / "requests.parquet", arm=FIXED_ARMS),
        summaries=expand(RES / "{{variant}}" / "{arm}" / "{{level}}" / "summary.json", arm=FIXED_ARMS),
    log:
        LOGS / "cells" / "{variant}.paired.{level}.log",
    benchmark:
        RES / "benchmarks" / "paired.{variant}.{level}.tsv"
    wildcard_constraints:
        variant=regex_of(PAIRED_VARIANTS),
        level=r"c\d+",
    priority: paired_priority_of
    conda:
        "../envs/specsweep.yaml"
    threads: MEASURE_THREADS
    resources:
        startup_timeout_s=lambda w: startup_timeout_s(config, w.variant),
        measure=1,
        slurm_partition=slurm("slurm_partition"),
        slurm_account=slurm("slurm_account"),
        gpu=slurm("gpu"),
        cpus_per_task=slurm("cpus_per_task"),
        mem_mb=slurm("mem_mb"),
        runtime=slurm("runtime"),
        constraint=slurm("constraint"),
        qos=slurm("qos"),
        slurm_extra=slurm("slurm_extra"),
    params:
        specs=paired_specs_json,
        out_root=lambda w: RES / w.variant,
        state_dir=STATE_DIR,
        server_logs=LOGS / "servers",
    shell:
        "python -m specsweep paired-level --specs {params.specs:q} --env {input.env} --out-root {params.out_root}"
        " --level {wildcards.level} --state-dir {params.state_dir} --server-log-dir {params.server_logs}"
        " --startup-timeout-s {resources.startup_timeout_s} > {log} 2>&1"


rule paired_policy:
    """Measure a policy arm's level in interleaved blocks with the best fixed arm there (the proof's pair)."""
    input:
        unpack(cell_inputs),
    output:
        requests=RES / "{variant}" / "{arm}" / "{level}" / "requests.parquet",
        summary=RES / "{variant}" / "{arm}" / "{level}" / "summary.json",
    log:
        LOGS / "cells" / "{variant}.{arm}.{level}.log",
    benchmark:
        RES / "benchmarks" / "cell.{variant}.{arm}.{level}.tsv"
    wildcard_constraints:
        variant=regex_of(PAIRED_VARIANTS),
        arm=regex_of(list(POLICY_ARMS)),
        level=r"c\d+",
    priority: cell_priority_of
    conda:
        "../envs/specsweep.yaml"
    threads: MEASURE_THREADS
    resources:
        startup_timeout_s=lambda w: startup_timeout_s(config, w.variant),
        measure=1,
        slurm_partition=slurm("slurm_partition"),
        slurm_account=slurm("slurm_account"),
        gpu=slurm("gpu"),
        cpus_per_task=slurm("cpus_per_task"),
        mem_mb=slurm("mem_mb"),
        runtime=slurm("runtime"),
        constraint=slurm("constraint"),
        qos=slurm("qos"),
        slurm_extra=slurm("slurm_extra"),
    params:
        specs=paired_policy_specs_json,
        out_root=lambda w: RES / w.variant,
        state_dir=STATE_DIR,
        server_logs=LOGS / "servers",
    shell:
        "python -m specsweep paired-level --specs {params.specs:q} --env {input.env} --out-root {params.out_root}"
        " --level {wildcards.level} --reference-of {wildcards.arm} --state-dir {params.state_dir}"
        " --server-log-dir {params.server_logs} --startup-timeout-s {resources.startup_timeout_s} > {log} 2>&1"


rule instance_cell:
    """Measure one level of a fixed arm on one of its server instances (pairing.instances; a segment's cell)."""
    input:
        unpack(cell_inputs),
    output:
        requests=RES / "{variant}" / "{arm}" / "{level}" / "instances" / "i{instance}" / "requests.parquet",
        summary=RES / "{variant}" / "{arm}" / "{level}" / "instances" / "i{instance}" / "summary.json",
    log:
        LOGS / "cells" / "{variant}.{arm}.{level}.i{instance}.log",
    benchmark:
        RES / "benchmarks" / "cell.{variant}.{arm}.{level}.i{instance}.tsv"
    wildcard_constraints:
        variant=regex_of(REPLICATED_VARIANTS),
        arm=regex_of(FIXED_ARMS),
        level=r"c\d+",
        instance=r"\d+",
    priority: instance_priority_of
    conda:
        "../envs/specsweep.yaml"
    threads: MEASURE_THREADS
    resources:
        startup_timeout_s=lambda w: startup_timeout_s(config, w.variant),
        measure=1,
        slurm_partition=slurm("slurm_partition"),
        slurm_account=slurm("slurm_account"),
        gpu=slurm("gpu"),
        cpus_per_task=slurm("cpus_per_task"),
        mem_mb=slurm("mem_mb"),
        runtime=slurm("runtime"),
        constraint=slurm("constraint"),
        qos=slurm("qos"),
        slurm_extra=slurm("slurm_extra"),
    params:
        spec=instance_spec_json,
        out_dir=lambda w: RES / w.variant / w.arm / w.level / "instances" / f"i{w.instance}",
        state_dir=STATE_DIR,
        server_logs=LOGS / "servers",
    shell:
        "python -m specsweep cell --spec {params.spec:q} --env {input.env} --out-dir {params.out_dir}"
        " --state-dir {params.state_dir} --server-log-dir {params.server_logs}"
        " --startup-timeout-s {resources.startup_timeout_s} > {log} 2>&1"


checkpoint segment_need:
    """After a sequential level's first N instance pairs: is its answer known, or is another pair measured there
    (precision.max_instances; the DAG is re-evaluated on the answer)."""
    input:
        lambda w: segment_cells(w, pairs=w.pairs),
        lambda w: segment_cells(w, "requests.parquet", pairs=w.pairs),
    output:
        segment_answer("{variant}", "{level}", "{pairs}"),
    log:
        LOGS / "cells" / "{variant}.segments.{level}.i{pairs}.log",
    wildcard_constraints:
        variant=regex_of(REPLICATED_VARIANTS),
        level=r"c\d+",
        pairs=r"\d+",
    priority: segment_need_priority(config)
    conda:
        "../envs/specsweep.yaml"
    params:
        variant_root=lambda w: RES / w.variant,
        arms=REFERENCE_FIRST,
        rule=segment_rule_args,
    shell:
        "python -m specsweep segment-need --variant-root {params.variant_root} --level {wildcards.level}"
        " --arms {params.arms} --instances {wildcards.pairs} {params.rule} --out {output} > {log} 2>&1"


rule merge_segments:
    """Every fixed arm's cell at a level, merged from its server instances' cells (pairing.instances, and the
    pairs the segment rule added)."""
    input:
        summaries=segment_cells,
        requests=lambda w: segment_cells(w, "requests.parquet"),
        decisions=segment_decisions,
    output:
        requests=expand(RES / "{{variant}}" / "{arm}" / "{{level}}" / "requests.parquet", arm=FIXED_ARMS),
        summaries=expand(RES / "{{variant}}" / "{arm}" / "{{level}}" / "summary.json", arm=FIXED_ARMS),
    log:
        LOGS / "cells" / "{variant}.merged.{level}.log",
    wildcard_constraints:
        variant=regex_of(REPLICATED_VARIANTS),
        level=r"c\d+",
    conda:
        "../envs/specsweep.yaml"
    params:
        variant_root=lambda w: RES / w.variant,
        arms=REFERENCE_FIRST,
        instances=lambda w, input: len(input.summaries) // len(FIXED_ARMS),
        rule=lambda w, input: (
            f"--decisions {' '.join(map(str, input.decisions))} {segment_rule_args(w)}" if input.decisions else ""
        ),
    shell:
        "python -m specsweep merge-segments --variant-root {params.variant_root} --level {wildcards.level}"
        " --arms {params.arms} --instances {params.instances} {params.rule} > {log} 2>&1"


ruleorder: paired_policy > paired_level > merge_segments > cell
