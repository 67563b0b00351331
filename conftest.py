"""Repo-level pytest set-up, kept small on purpose.

Its presence makes pytest put the repository root on sys.path, so ``trainer`` and ``pytest_rlbench``
import from a plain checkout. The plugin itself loads through its ``pytest11`` entry point
(``pip install -e .``); it is not listed here, since listing it too would register it twice.
"""
