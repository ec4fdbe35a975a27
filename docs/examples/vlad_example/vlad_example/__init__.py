"""Example vlad plugins (docs/plugins.md): :mod:`vlad_example.backend` and :mod:`vlad_example.door`."""
