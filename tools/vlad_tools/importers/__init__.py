"""Importers: checkpoints of other frameworks turned into checked, signed vlad releases.

Tools, not the robot: the daemon never imports this package, and each importer's framework
is an extra (``vlad[lerobot]``). :mod:`vlad_tools.importers.lerobot` is ``vladctl import lerobot``.
"""
