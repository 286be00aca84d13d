"""The simulated engine: one engine model (engine.py), its profiles (profile.py), its HTTP server in real time
(server.py, with faults.py and prefixcache.py). The same engine in virtual time is `specsweep.virtual`.

See docs/sim.md for the step-time model, the profiles, the server API and calibration.
"""
