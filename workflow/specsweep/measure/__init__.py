"""Measuring a cell and judging it: the cell job (cell.py), a level of every arm in interleaved blocks
(interleave.py) or in counterbalanced segments (segments.py), the metric definitions (metrics.py), their
judgement (gates.py), cells that heal themselves (heal.py), summary.json written and read (summary.py), and
`specsweep bench`, the same measuring path without Snakemake (bench.py)."""
