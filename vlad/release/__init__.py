"""Releases: the signed manifest (:mod:`~vlad.release.manifest`, authoring helpers in
:mod:`~vlad.release.authoring`), signatures and verification (:mod:`~vlad.release.signing`),
the on-robot store (:mod:`~vlad.release.store`), loading a release as a policy
(:mod:`~vlad.release.loading`) and the checked export (:mod:`~vlad.release.export`)."""
