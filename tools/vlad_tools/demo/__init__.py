"""Demo VLA task: a simulated planar reacher robot, its scripted expert and evaluation helpers."""
