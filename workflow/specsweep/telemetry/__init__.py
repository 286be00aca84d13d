"""The serving side's state during a block, from its real sources: the server process tree's CPU, memory and
CPU allowance (`process`, from /proc and the cgroup), and the GPUs' clocks, power and throttle reasons (`gpu`,
through NVML). Read by the load generator around each block and by `specsweep preflight`; judged by
`specsweep.measure.gates` (docs/metrics.md, "Serving side")."""
