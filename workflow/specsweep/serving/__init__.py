"""Engine servers' lifecycle: start, reuse and stop by identity, one per resource, with a watchdog (servers.py);
the SLURM job that hosts a server group (serverhost.py); a job's environment (jobenv.py); process liveness
(liveness.py)."""
