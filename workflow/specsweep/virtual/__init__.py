"""The simulated engine's model in virtual time: a sweep predicted (predict.py, forecast.py), a config's run
planned with its cost (plan.py), a profile fitted to measured cells with its uncertainty (fit.py, bounds.py,
uncertainty.py, calibrate.py, derive_stacks.py), and the real-time server checked against it (loadcheck.py).

Apart from `specsweep.sim` (the engine and its server, which the config and the engines import) because it
builds on the analysis, the config and the client: inside `sim` that closed import cycles.
"""
