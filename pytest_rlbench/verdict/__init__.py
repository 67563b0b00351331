"""From records to verdicts: the figures derived from raw values (``derived``, with device peaks in
``peaks``), whether a pair of records can be a gate and on what basis (``compare``, ``gate_basis``),
the judge of one figure (``judge``: tolerance, ``noise`` floors, the ``rank_test``), the CPU evidence
that separates a regression from a slower host (``session_pace``, ``retiming``, ``machine_load``), and
the published baselines' consistency (``consistency``). Pure functions over records.
"""
