# The stack under test: build (or reuse) each variant's environment and record its fingerprint.


rule preflight:
    """Before anything is built or started: the variant's GPUs, compute capability, driver, disk, models, port and
    package indexes (specsweep preflight); an error stops the variant and names the fix."""
    output:
        RES / "preflight" / "{variant}.json",
    log:
        LOGS / "preflight" / "{variant}.log",
    conda:
        "../envs/specsweep.yaml"
    resources:
        # where the variant's servers run (GPUs, driver, ports and disk are those of that node)
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
        spec=preflight_spec_json,
    shell:
        "python -m specsweep preflight --spec {params.spec:q} --out {output} > {log} 2>&1"


rule env:
    """Build the variant's environment from its envs/ recipe (reused while unchanged) and fingerprint it."""
    input:
        recipe=recipe_input,
        # ancient: a preflight rerun (its config slice changed) checks again without rebuilding the stack
        preflight=ancient(RES / "preflight" / "{variant}.json"),
    output:
        report(
            RES / "envs" / "{variant}.json",
            category="Stacks",
            caption="../report/fingerprints.rst",
            labels={"variant": "{variant}", "file": "fingerprint"},
        ),
    log:
        LOGS / "env" / "{variant}.log",
    benchmark:
        RES / "benchmarks" / "env.{variant}.tsv"
    conda:
        "../envs/specsweep.yaml"
    resources:
        # on a cluster, on a node like the servers' (the fingerprint reads its GPUs and driver)
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
        args=fingerprint_args,
        recipe_sha256=recipe_digest,
        envs_root=Path(config["envs_dir"] or Path(config["results_dir"]) / "_envs"),
    shell:
        "python -m specsweep fingerprint {params.args} --envs-root {params.envs_root} --out {output} > {log} 2>&1"


rule model:
    """Build a model locally (no downloads) for variants with a model_builder, in the variant's environment."""
    input:
        env=rules.env.output[0],
        builder=builder_input,
    output:
        RES / "models" / "{variant}" / "config.json",
    log:
        LOGS / "model" / "{variant}.log",
    benchmark:
        RES / "benchmarks" / "model.{variant}.tsv"
    conda:
        "../envs/specsweep.yaml"
    resources:
        # on a cluster, on a node like the servers' (the fingerprint reads its GPUs and driver)
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
        builder=lambda w: config["variants"][known("variant", w.variant, VARIANTS)]["model_builder"],
        out_dir=lambda w: RES / "models" / w.variant,
    shell:
        "python -m specsweep build-model --env {input.env} --builder {params.builder} --out {params.out_dir} > {log} 2>&1"
