"""The simulated engine: one engine model (engine.py), two clocks (server.py real time, predict.py virtual).

See docs/sim.md for the step-time model, the profiles, the server API and calibration.
"""
