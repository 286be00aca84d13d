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
    resources:
        startup_timeout_s=lambda w: startup_timeout_s(config, w.variant),
        # one cell at a time per server: on a cluster, a server's cells run one after another in its job
        # (workflow/profiles/slurm groups them and scopes this resource to the job)
        server=1,
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
