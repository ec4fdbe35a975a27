"""Fleets: releases through OCI registries and over-the-air updaters (docs/fleet.md)."""
