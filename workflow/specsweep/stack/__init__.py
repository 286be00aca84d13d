"""A variant's software stack: its environment built from an `envs/` recipe (envbuild.py), fingerprinted
(fingerprint.py) and summed up for every run (stack_facts.py), the locally built model (modelbuild.py,
tiny_model.py), and the checks before anything starts (preflight.py)."""
